"""PNG figures of a gradient-bias study: each function takes the study result
(`kljax.studies.bias.study.run_study`) and returns a matplotlib Figure (object-oriented API, no pyplot:
the user's backend is left alone, and a notebook displays the returned Figure); `save_all` writes
every one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure

# Relative biases below UNBIASED are drawn on a floor at FLOOR (exact unbiased ones are ~1e-15).
UNBIASED = 1e-6
FLOOR = 1e-4
# Configurations drawn in the off-policy figures (when studied).
KEY_CONFIGS = (
    "k1-reward",
    "k3-reward",
    "k1-loss",
    "k3-loss",
    "k1-both",
    "k3-both",
    "full-both-rtg",
    "k1-reward-seqw",
    "k1-reward-seqw2",
    "k3-loss-tokratio",
    "full-both-rtg-seqw",
)


def _rows(result: Mapping[str, Any], figure: str, mode: str | None = None) -> list[dict]:
    return [r for r in result["records"] if r["figure"] == figure and (mode is None or r["mode"] == mode)]


def _series(rows: Sequence[dict], config: str, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    pts = sorted((r[x], r[y]) for r in rows if r["config"] == config and r.get(y) is not None)
    if not pts:
        return np.zeros(0), np.zeros(0)
    xs, ys = zip(*pts, strict=True)
    return np.asarray(xs, float), np.asarray(ys, float)


def _table_names(result: Mapping[str, Any], limit: int = 12) -> list[str]:
    names = [r["name"] for r in result["table"] if r["name"] != "none"]
    return names[:limit]


def _key_names(result: Mapping[str, Any]) -> list[str]:
    """The table's configurations when few, else the key ones; plus the off-policy corrections."""
    studied = {r["config"] for r in result["records"]}
    table = _table_names(result, limit=100)
    base = table if len(table) <= 8 else [n for n in KEY_CONFIGS[:7] if n in table] or table[:8]
    extra = [n for n in KEY_CONFIGS[7:] if n in studied]
    return list(dict.fromkeys(base + extra))


def _colors(names: Sequence[str]) -> dict[str, Any]:
    cmap = matplotlib.colormaps["tab20"]
    return {n: cmap(i % 20) for i, n in enumerate(names)}


def _legend(fig: Figure, ax: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)


def _bias_axis(ax: Any, xlabel: str, title: str) -> None:
    """Log relative-bias axis; values under UNBIASED (exactly unbiased) sit on the shaded floor."""
    ax.axhspan(FLOOR / 2, FLOOR * 2, color="0.9", zorder=0)
    ax.text(0.02, 0.02, f"unbiased (< {UNBIASED:g})", transform=ax.transAxes, fontsize=8, color="0.3")
    ax.set(yscale="log", ylim=(FLOOR / 2, 5), xlabel=xlabel, ylabel="relative bias ||E g - g*|| / ||g*||", title=title)


def _floored(b: np.ndarray) -> np.ndarray:
    return np.where(b < UNBIASED, FLOOR, b)


def bias_variance_vs_length(result: Mapping[str, Any]) -> Figure:
    """Relative bias (exact) and variance (exact and Monte Carlo) of each configuration vs length."""
    names = _table_names(result)
    colors = _colors(names)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_b, ax_v = fig.subplots(1, 2)
    first = "exact" if _rows(result, "vs_length", "exact") else "montecarlo"
    for mode, style in (("exact", "-o"), ("montecarlo", ":x")):
        rows = _rows(result, "vs_length", mode)
        for n in names:
            x, v = _series(rows, n, "length", "variance")
            if x.size == 0:
                continue
            ax_v.plot(x[v > 0], v[v > 0], style, color=colors[n], ms=3)  # zero variance: off a log axis
            if mode == first:  # Monte-Carlo biases are dominated by their noise floor: exact only
                x, b = _series(rows, n, "length", "relative_bias")
                ax_b.plot(x, _floored(b), "-o", color=colors[n], ms=3, label=n)
    _bias_axis(ax_b, "response length T", f"bias vs length ({first})")
    ax_v.set(
        yscale="log",
        xlabel="response length T",
        ylabel=f"variance (B = {result['settings']['samples']})",
        title="variance vs length (- exact, : Monte Carlo)",
    )
    _legend(fig, ax_b)
    return fig


def bias_variance_vs_samples(result: Mapping[str, Any]) -> Figure:
    """Variance and relative RMSE versus batch size: exact curves, Monte-Carlo points."""
    names = _table_names(result)
    colors = _colors(names)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_v, ax_e = fig.subplots(1, 2)
    first = "exact" if _rows(result, "vs_samples", "exact") else "montecarlo"
    for mode, style in (("exact", "-"), ("montecarlo", "x")):
        rows = _rows(result, "vs_samples", mode)
        for n in names:
            x, v = _series(rows, n, "samples", "variance")
            if x.size == 0:
                continue
            label = n if mode == first else None
            ax_v.plot(x, v, style, color=colors[n], label=label)
            x, e = _series(rows, n, "samples", "relative_rmse")
            ax_e.plot(x, e, style, color=colors[n])
    ax_v.set(
        xscale="log",
        yscale="log",
        xlabel="batch size B",
        ylabel="variance of the batch estimate",
        title="variance ~ 1/B (- exact, x Monte Carlo)",
    )
    counts = sorted({r["samples"] for r in _rows(result, "vs_samples")})
    for ax in (ax_v, ax_e):
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.minorticks_off()
    ax_e.set(
        xscale="log",
        yscale="log",
        xlabel="batch size B",
        ylabel="relative RMSE sqrt(mse) / ||g*||",
        title="error: biased ones level off at their bias",
    )
    _legend(fig, ax_v)
    return fig


def cosine_vs_staleness(result: Mapping[str, Any]) -> Figure:
    """Cosine with grad KL_seq and relative bias versus sampler staleness (exact)."""
    names = _key_names(result)
    colors = _colors(names)
    mode = "exact" if _rows(result, "vs_staleness", "exact") else "montecarlo"
    rows = _rows(result, "vs_staleness", mode)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_c, ax_b = fig.subplots(1, 2)
    for n in names:
        x, c = _series(rows, n, "staleness", "cosine")
        if x.size == 0:
            continue
        ax_c.plot(x, c, "-o", color=colors[n], ms=3, label=n)
        x, b = _series(rows, n, "staleness", "relative_bias")
        ax_b.plot(x, _floored(b), "-o", color=colors[n], ms=3)
    ax_c.set(
        xlabel="sampler staleness (optimizer steps)",
        ylabel="cosine(E g, grad KL_seq)",
        title=f"cosine vs staleness ({mode})",
    )
    _bias_axis(ax_b, "sampler staleness (optimizer steps)", "bias vs staleness")
    _legend(fig, ax_c)
    return fig


def cosine_vs_interpolation(result: Mapping[str, Any]) -> Figure:
    """Cosine and relative bias versus the logit-space interpolation alpha of the sampler."""
    names = _key_names(result)
    colors = _colors(names)
    rows = _rows(result, "vs_alpha", "exact")
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for n in names:
        x, c = _series(rows, n, "alpha", "cosine")
        if x.size:
            ax.plot(x, c, "-o", color=colors[n], ms=3, label=n)
    ax.set(
        xlabel="alpha: sampler logits = theta + alpha (other - theta)",
        ylabel="cosine(E g, grad KL_seq)",
        title="cosine vs sampler interpolation (exact)",
    )
    _legend(fig, ax)
    return fig


def offpolicy_tradeoff(result: Mapping[str, Any]) -> Figure:
    """Off-policy corrections: relative bias^2 vs relative variance at the study's batch size, and
    relative MSE = bias^2 + variance_1 / B versus B (exact moments: where unbiasedness pays off)."""
    rows = result["offpolicy"]
    s = result["settings"]
    colors = _colors([r["name"] for r in rows])
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_s, ax_m = fig.subplots(1, 2)
    batch = np.unique(np.round(np.logspace(0, 4, 25)).astype(int))
    for r in rows:
        b2 = max(r["relative_bias_sq"], FLOOR**2 * 10)
        ax_s.scatter(r["relative_variance"], b2, color=colors[r["name"]], s=25, label=r["name"])
        ax_s.annotate(r["name"], (r["relative_variance"], b2), fontsize=6, xytext=(3, 2), textcoords="offset points")
        var1 = r["relative_variance"] * r["samples"]
        ax_m.plot(batch, r["relative_bias_sq"] + var1 / batch, color=colors[r["name"]])
    ax_s.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_s.text(0.02, 0.02, "bottom row: unbiased", transform=ax_s.transAxes, fontsize=8, color="0.3")
    ax_s.set(
        xscale="log",
        yscale="log",
        xlabel=f"relative variance (B = {s['samples']})",
        ylabel="relative bias^2 (floor: unbiased)",
        title=f"sampler {s['staleness']} steps stale",
    )
    ax_m.set(
        xscale="log",
        yscale="log",
        xlabel="batch size B",
        ylabel="relative MSE = bias^2 + variance / B",
        title="unbiased corrections win once B is large",
    )
    _legend(fig, ax_s)
    return fig


def rao_blackwell(result: Mapping[str, Any]) -> Figure:
    """Variance of k1-reward, k1-reward-rtg and full-both-rtg versus length."""
    rows = _rows(result, "rao_blackwell")
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for (mode, style), name in (
        (m, n) for m in (("exact", "-o"), ("montecarlo", ":x")) for n in ("k1-reward", "k1-reward-rtg", "full-both-rtg")
    ):
        x, v = _series([r for r in rows if r["mode"] == mode], name, "length", "variance")
        keep = v > 0
        if x[keep].size:
            ax.plot(x[keep], v[keep], style, label=f"{name} ({mode})", ms=4)
    ax.set(
        yscale="log",
        xlabel="response length T",
        ylabel="variance of the batch estimate",
        title="Rao-Blackwellized full-vocabulary KL vs k1 in reward",
    )
    ax.legend(fontsize=8)
    return fig


def total_vs_beta(result: Mapping[str, Any]) -> Figure:
    """Cosine of the whole RL loss gradient (REINFORCE + beta * KL estimate) with the truth vs beta."""
    names = _table_names(result)
    colors = _colors(names)
    rows = _rows(result, "vs_beta")
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for n in names:
        x, c = _series(rows, n, "beta", "cosine")
        if x.size:
            ax.plot(x, c, "-o", color=colors[n], ms=3, label=n)
    ax.set(
        xscale="log",
        xlabel="beta",
        ylabel="cosine(E g_total, -grad E[R] + beta grad KL_seq)",
        title="how much the KL bias matters in the whole gradient",
    )
    _legend(fig, ax)
    return fig


FIGURES = {
    "bias_variance_vs_length": bias_variance_vs_length,
    "bias_variance_vs_samples": bias_variance_vs_samples,
    "cosine_vs_staleness": cosine_vs_staleness,
    "cosine_vs_interpolation": cosine_vs_interpolation,
    "offpolicy_tradeoff": offpolicy_tradeoff,
    "rao_blackwell": rao_blackwell,
    "total_gradient_vs_beta": total_vs_beta,
}


def save_all(result: Mapping[str, Any], out_dir: str | Path, dpi: int = 110) -> list[Path]:
    """Write every figure that has data as OUT/<name>.png; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fn in FIGURES.items():
        fig = fn(result)
        if not any(ax.has_data() for ax in fig.axes):
            continue
        path = out / f"{name}.png"
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
        paths.append(path)
    return paths
