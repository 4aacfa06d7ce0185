"""PNG figures of a convergence study (`study.run_study` rows and curves): matplotlib Figures built
with the object-oriented API (no pyplot: the user's backend is left alone; a notebook shows the
returned Figure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

FLOOR = 1e-6  # gaps are drawn on a log scale, clipped at this floor


def _presets(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["preset"] for r in rows))


def gap_curves(rows: Sequence[Mapping[str, Any]], curves: Mapping[str, Mapping[str, Any]], async_level: int,
               presets: Sequence[str] | None = None) -> Figure:
    """One panel per preset: the gap beta KL(pi || pi*) over steps at `async_level`, one line per
    beta (the mean over seeds) with a band from the seeds' min to max."""
    presets = list(presets or _presets(rows))
    cols = min(4, len(presets))
    nrows = -(-len(presets) // cols)
    fig = Figure(figsize=(3.6 * cols, 2.8 * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False, sharex=True, sharey=True)
    betas = sorted({r["beta"] for r in rows})
    colors = dict(zip(betas, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"),
                      strict=False))
    for ax, preset in zip(axes.flat, presets, strict=False):
        for r in rows:
            if r["preset"] != preset or r["async_level"] != async_level or r["name"] not in curves:
                continue
            gap = np.clip(np.asarray(curves[r["name"]]["gap"], float), FLOOR, None)  # [steps + 1, seeds]
            steps = np.arange(gap.shape[0])
            color = colors.get(r["beta"], "k")
            ax.plot(steps, gap.mean(axis=1), color=color, lw=1.2, label=f"beta {r['beta']:g}")
            ax.fill_between(steps, gap.min(axis=1), gap.max(axis=1), color=color, alpha=0.2, lw=0)
        verdict = next((r["verdict"] for r in rows if r["preset"] == preset and r["async_level"] == async_level), "")
        ax.set_title(f"{preset} ({verdict})", fontsize=9)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(presets):]:
        ax.set_visible(False)
    axes[0, 0].legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("gap = beta KL(pi || pi*)")
    for ax in axes[-1, :]:
        ax.set_xlabel("step")
    fig.suptitle(f"Gap to the optimum, async_level={async_level} (mean over seeds, band: min-max)")
    return fig


def off_policy_panel(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """One panel per beta: the final gap relative to the initial gap per preset (x) and sampler
    staleness (bars); hatched bars are rows unstable by the study's rule, NaN drawn at 1e3."""
    betas = sorted({r["beta"] for r in rows})
    presets = _presets(rows)
    levels = sorted({r["async_level"] for r in rows})
    fig = Figure(figsize=(min(14.0, max(6.0, 0.3 * len(presets) * len(levels))), 2.6 * len(betas) + 1.0),
                 layout="constrained")
    axes = fig.subplots(len(betas), 1, squeeze=False, sharex=True)[:, 0]
    width = 0.8 / len(levels)
    for ax, beta in zip(axes, betas, strict=True):
        for j, level in enumerate(levels):
            for i, preset in enumerate(presets):
                row = next((r for r in rows if r["preset"] == preset and r["async_level"] == level
                            and r["beta"] == beta), None)
                if row is None:
                    continue
                final = row["final_gap_mean"]
                value = max(final / row["initial_gap"], FLOOR) if final is not None and np.isfinite(final) else 1e3
                ax.bar(i + (j - (len(levels) - 1) / 2) * width, value, width, color=f"C{j}",
                       hatch="//" if row["unstable"] else None, edgecolor="k", lw=0.3,
                       label=f"async_level {level}" if i == 0 else None)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_ylabel(f"beta {beta:g}\nfinal / initial gap", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(range(len(presets)), presets, rotation=60, ha="right", fontsize=8)
    axes[0].legend(fontsize=7, ncol=len(levels))
    fig.suptitle("Stale samplers: final gap relative to the start (hatched: unstable)")
    return fig
