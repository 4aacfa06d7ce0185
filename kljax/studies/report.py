"""`kljax report SWEEP_DIR`: SWEEP_DIR/report.md with tables and PNG figures from summary.json.

A configuration is a grid point without its seed (KL configuration, beta, variant); its curves are
the mean over seeds at each step, the shaded band their min..max, after a centred moving average of
`smooth` steps (default: 5% of the run). Final accuracies are mean +- standard deviation over seeds (and
min..max) of eval_after.json's greedy accuracy, per split; splits named "ood*" are out-of-domain.

Instability rule (`InstabilityRule`, with T steps, the early window = the first ceil(20% T) steps
and the tail = the last max(2, ceil(10% T)) steps, or all steps when T < 2): a run is unstable if
  1. non-finite: some step has a non-finite loss, kl_seq or grad_norm, or the step was skipped for
     a non-finite loss/gradient (`nonfinite` = 1); or
  2. KL blow-up: kl_seq exceeds 10 x max(median of kl_seq over the early window, 0.05 nats) at every
     step of the tail (it exceeded it and stayed above it to the end); or
  3. entropy collapse: the mean token entropy is below 10% of its median over the early window at
     every step of the tail.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from kljax.errors import read_json
from kljax.rl.kl import KLConfig
from kljax.verdicts.kl import describe

CURVE_PANELS = ("reward", "kl_seq", "entropy", "grad_norm")


@dataclasses.dataclass(frozen=True)
class InstabilityRule:
    """The thresholds of the rule in the module docstring."""

    early_fraction: float = 0.2
    tail_fraction: float = 0.1
    kl_factor: float = 10.0
    kl_floor: float = 0.05
    entropy_fraction: float = 0.1

    def describe(self) -> str:
        return (
            f"With T steps, the early window is the first ceil({self.early_fraction:.0%} of T) steps and the tail "
            f"the last max(2, ceil({self.tail_fraction:.0%} of T)) steps. A run is **unstable** if (1) any step has "
            "a non-finite loss, kl_seq or grad_norm, or was skipped for a non-finite loss/gradient; or (2) kl_seq "
            f"exceeds {self.kl_factor:g} x max(its median over the early window, {self.kl_floor:g} nats) at every "
            "step of the tail (it blew up and stayed up); or (3) the mean token entropy is below "
            f"{self.entropy_fraction:.0%} of its early-window median at every step of the tail (entropy collapse)."
        )


def _windows(t: int, rule: InstabilityRule) -> tuple[slice, slice]:
    early = max(1, math.ceil(rule.early_fraction * t))
    tail = min(t, max(2, math.ceil(rule.tail_fraction * t)))
    return slice(0, early), slice(t - tail, t)


def instability(curves: dict[str, list[float]], rule: InstabilityRule = InstabilityRule()) -> list[str]:
    """The reasons (possibly none) a run's curves make it unstable under `rule`."""
    reasons = []
    arrays = {k: np.asarray(v, np.float64) for k, v in curves.items()}
    bad = [k for k in ("loss", "kl_seq", "grad_norm") if k in arrays and not np.all(np.isfinite(arrays[k]))]
    skipped = int(np.nansum(arrays["nonfinite"] > 0)) if "nonfinite" in arrays else 0
    if bad or skipped:
        what = ", ".join(f"non-finite {k}" for k in bad) + (f"{', ' if bad else ''}{skipped} skipped step(s)"
                                                             if skipped else "")
        reasons.append(what)
    kl = arrays.get("kl_seq")
    if kl is not None and len(kl):
        early, tail = _windows(len(kl), rule)
        threshold = rule.kl_factor * max(float(np.nanmedian(kl[early])) if np.isfinite(kl[early]).any() else 0.0,
                                         rule.kl_floor)
        if np.all(kl[tail] > threshold):
            reasons.append(f"KL blow-up: kl_seq > {threshold:.3g} over the last {len(kl[tail])} steps")
    ent = arrays.get("entropy")
    if ent is not None and len(ent) and np.isfinite(ent).any():
        early, tail = _windows(len(ent), rule)
        initial = float(np.nanmedian(ent[early]))
        if initial > 0 and np.all(ent[tail] < rule.entropy_fraction * initial):
            reasons.append(f"entropy collapse: below {rule.entropy_fraction * initial:.3g} "
                           f"(10% of {initial:.3g}) over the last {len(ent[tail])} steps")
    return reasons


# ------------------------------------------------------------------------------------------ aggregation


def load_summary(sweep_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(sweep_dir) / "summary.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist: run `kljax sweep --config ... --out {sweep_dir}` first")

    summary = read_json(path, "sweep summary")
    if not isinstance(summary, dict):
        raise ValueError(f"sweep summary {path} holds a {type(summary).__name__}, not a JSON object")
    return summary


def groups(runs: list[dict[str, Any]]) -> OrderedDict[str, list[dict[str, Any]]]:
    """Finished runs by configuration (grid order kept)."""
    out: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
    for r in runs:
        if r["status"] == "finished":
            out.setdefault(r["group"], []).append(r)
    return out


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over `window` steps (shrinking at the ends; NaNs ignored)."""
    if window <= 1 or len(values) < 3:
        return values
    half = window // 2
    return np.asarray([np.nanmean(values[max(0, i - half) : i + half + 1]) if np.isfinite(
        values[max(0, i - half) : i + half + 1]).any() else np.nan for i in range(len(values))])


def seed_band(runs: list[dict[str, Any]], key: str, window: int) -> tuple[np.ndarray, ...] | None:
    """(steps, mean, min, max) over seeds at the steps every seed has; None when no run has the key."""
    series = [r for r in runs if key in r["curves"]]
    if not series:
        return None
    t = min(len(r["curves"][key]) for r in series)
    stack = np.stack([smooth(np.asarray(r["curves"][key][:t], np.float64), window) for r in series])
    steps = np.asarray(series[0]["steps"][:t])
    with np.errstate(all="ignore"):
        return steps, np.nanmean(stack, 0), np.nanmin(stack, 0), np.nanmax(stack, 0)


def final_accuracy(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{split: {mean, std, min, max, n}} of the greedy accuracy after training, over the runs (seeds);
    plus "in-domain" and "out-of-domain" (the mean over the respective splits of each run)."""
    per_split: dict[str, list[float]] = OrderedDict()
    for r in runs:
        after = r.get("eval_after") or {}
        ind = [v["accuracy"] for s, v in after.items() if not s.startswith("ood")]
        ood = [v["accuracy"] for s, v in after.items() if s.startswith("ood")]
        for s, v in after.items():
            per_split.setdefault(s, []).append(float(v["accuracy"]))
        if ind:
            per_split.setdefault("in-domain", []).append(float(np.mean(ind)))
        if ood:
            per_split.setdefault("out-of-domain", []).append(float(np.mean(ood)))
    return {s: {"mean": float(np.mean(v)), "std": float(np.std(v)), "min": float(np.min(v)),
                "max": float(np.max(v)), "n": len(v)} for s, v in per_split.items()}


def tail_mean(values: list[float], fraction: float = 0.1) -> float:
    """Mean over the last `fraction` of the steps (at least one)."""
    a = np.asarray(values, np.float64)
    if not len(a):
        return math.nan
    n = max(1, math.ceil(fraction * len(a)))
    return float(np.nanmean(a[-n:])) if np.isfinite(a[-n:]).any() else math.nan


# ------------------------------------------------------------------------------------------ figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(grouped: dict[str, list[dict[str, Any]]], out: Path, title: str, window: int) -> Path:
    """One PNG: a panel per metric of CURVE_PANELS, a line per configuration (mean over seeds, band min..max)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(4.2 * len(CURVE_PANELS), 3.6), squeeze=False)
    colors = plt.get_cmap("tab10")
    kl_names = list(OrderedDict.fromkeys(rs[0]["kl_name"] for rs in grouped.values()))
    betas = list(OrderedDict.fromkeys(rs[0]["beta"] for rs in grouped.values()))
    styles = ("-", "--", ":", "-.")
    for group, runs in grouped.items():
        color = colors(kl_names.index(runs[0]["kl_name"]) % 10)  # colour: KL configuration; line style: beta
        style = styles[betas.index(runs[0]["beta"]) % len(styles)]
        for ax, key in zip(axes[0], CURVE_PANELS, strict=True):
            band = seed_band(runs, key, window)
            if band is None:
                continue
            steps, mean, lo, hi = band
            ax.plot(steps, mean, lw=1.3, color=color, ls=style, label=f"{group} (n={len(runs)})")
            if len(runs) > 1:
                ax.fill_between(steps, lo, hi, color=color, alpha=0.15, lw=0)
    for ax, key in zip(axes[0], CURVE_PANELS, strict=True):
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        if key in ("kl_seq", "grad_norm"):
            ax.set_yscale("symlog", linthresh=1e-2)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_final_accuracy(table: dict[str, dict[str, dict[str, float]]], out: Path,
                        before: dict[str, float] | None = None) -> Path:
    """Grouped bars: in-domain and out-of-domain final accuracy per configuration, error bars min..max;
    `before` ({"in-domain": a, "out-of-domain": b}) is drawn as horizontal lines (the start of RL)."""
    plt = _plt()
    names = list(table)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(names) + 2), 4.0))
    x = np.arange(len(names))
    for j, (dom, color) in enumerate((("in-domain", "tab:blue"), ("out-of-domain", "tab:orange"))):
        stats = [table[n].get(dom) for n in names]
        mean = np.asarray([s["mean"] if s else np.nan for s in stats])
        lo = np.asarray([s["mean"] - s["min"] if s else 0.0 for s in stats])
        hi = np.asarray([s["max"] - s["mean"] if s else 0.0 for s in stats])
        ax.bar(x + (j - 0.5) * 0.4, mean, 0.4, yerr=[lo, hi], capsize=2, color=color, label=dom)
        if before and dom in before:
            ax.axhline(before[dom], color=color, ls="--", lw=1, label=f"{dom} before RL")
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("greedy accuracy after RL")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------ report


def _fmt(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['mean']:.3f} ± {s['std']:.3f} [{s['min']:.2f}, {s['max']:.2f}]"


def _unbiased(run: dict[str, Any]) -> str:
    """Whether the run's KL configuration has an unbiased gradient of KL_seq (on-policy / off-policy)."""

    if run["kl"].get("placement") == "none":
        return "(no KL)"
    info = describe(KLConfig.from_mapping(run["kl"]))
    return f"{'yes' if info.unbiased else 'no'} / {'yes' if info.unbiased_off_policy else 'no'} off-policy"


def _variant_of(runs: list[dict[str, Any]]) -> str:
    return str(runs[0].get("variant", "default"))


def write_report(sweep_dir: str | os.PathLike, rule: InstabilityRule = InstabilityRule(),
                 smooth_fraction: float = 0.05) -> Path:
    """Write SWEEP_DIR/report.md and SWEEP_DIR/figures/*.png; returns the report's path."""
    sweep_dir = Path(sweep_dir)
    summary = load_summary(sweep_dir)
    runs = summary["runs"]
    grouped = groups(runs)
    figures = sweep_dir / "figures"
    figures.mkdir(exist_ok=True)
    lines = [f"# Sweep report: {sweep_dir.name}", ""]
    status = {s: sum(r["status"] == s for r in runs) for s in ("finished", "partial", "broken", "new", "unsupported")}
    here = os.getcwd() + os.sep  # the report is committed: paths under the working directory are shown relative

    def shown(text: object) -> str:
        return str(text).replace(here, "")

    lines += [f"Base run config: `{shown(summary.get('base_config'))}`; "
              f"sweep config: `{shown(summary.get('sweep_config'))}`.", "",
              "Runs: " + ", ".join(f"{n} {s}" for s, n in status.items() if n) + ".", ""]
    shared = [o for o in runs[0].get("overrides", []) if all(o in r.get("overrides", []) for r in runs)] if runs else []
    if shared:
        lines += ["Overrides of the base config shared by every run (in order; a later one wins): "
                  + ", ".join(f"`{shown(o)}`" for o in shared) + ".", ""]
    unsupported = [r for r in runs if r["status"] == "unsupported"]
    if unsupported:
        lines += ["Not run (rejected by the trainer's validation): "
                  + ", ".join(sorted({r["group"] for r in unsupported}))
                  + f". Reason: {unsupported[0]['unsupported']}", ""]
    sft = summary.get("sft")
    if sft:
        acc = ", ".join(f"{k} {v:.3f}" for k, v in sft["greedy_accuracy"].items())
        lines += ["## Reference model (supervised warm start)", "",
                  f"{sft['settings']['steps']} steps of cross-entropy on correct answers of "
                  f"`{sft['settings']['task']}:{sft['settings']['split']}`; final loss {sft['loss'][-1]:.3f}; "
                  f"greedy accuracy: {acc}.", ""]
    if not grouped:
        lines += ["No finished runs yet."]
        out = sweep_dir / "report.md"
        out.write_text("\n".join(lines) + "\n")
        return out

    # Final accuracy per configuration.
    acc = OrderedDict((g, final_accuracy(rs)) for g, rs in grouped.items())
    splits = list(OrderedDict.fromkeys(s for t in acc.values() for s in t))
    before = next((r["eval_before"] for rs in grouped.values() for r in rs if r.get("eval_before")), None)
    lines += ["## Final greedy accuracy", "",
              "Mean ± std [min, max] over seeds of the greedy accuracy after RL (eval_after.json). "
              "In-domain: splits not named ood*; out-of-domain: ood* splits.", ""]
    if before:
        lines += ["Before RL (the starting/reference policy, seed of the first run): "
                  + ", ".join(f"{s} {v['accuracy']:.3f}" for s, v in before.items()), ""]
    lines += ["| configuration | seeds | " + " | ".join(splits) + " |", "|---|---|" + "---|" * len(splits)]
    for g, table in acc.items():
        lines.append(f"| {g} | {len(grouped[g])} | " + " | ".join(_fmt(table.get(s)) for s in splits) + " |")
    start = {}
    for dom, ood in (("in-domain", False), ("out-of-domain", True)):
        vals = [v["accuracy"] for s, v in (before or {}).items() if s.startswith("ood") == ood]
        if vals:
            start[dom] = float(np.mean(vals))
    fig = plot_final_accuracy(acc, figures / "final_accuracy.png", start)
    lines += ["", f"![final accuracy]({fig.relative_to(sweep_dir)})", ""]

    # Curves per variant.
    lines += ["## Training curves", "",
              "Reward, sequence-level KL to the reference (kl_seq = sum_t log pi/pi_ref of the sampled "
              "responses), mean token entropy and gradient norm (before clipping) over steps: mean over seeds, "
              "shaded min..max, centred moving average over "
              f"{smooth_fraction:.0%} of the steps.", ""]
    variants = OrderedDict.fromkeys(_variant_of(rs) for rs in grouped.values())
    for variant in variants:
        sub = OrderedDict((g, rs) for g, rs in grouped.items() if _variant_of(rs) == variant)
        t = max(len(r["steps"]) for rs in sub.values() for r in rs)
        fig = plot_curves(sub, figures / f"curves_{variant}.png", f"variant: {variant}",
                          max(1, round(smooth_fraction * t)))
        lines += [f"### {variant}", "", f"![curves {variant}]({fig.relative_to(sweep_dir)})", ""]
    lines += ["| configuration | unbiased KL grad | final reward | final kl_seq | final entropy | max grad_norm "
              "| unstable |", "|---|---|---|---|---|---|---|"]
    flagged = []
    for g, rs in grouped.items():
        cols = [_unbiased(rs[0])]
        for key in ("reward", "kl_seq", "entropy"):
            vals = [tail_mean(r["curves"].get(key, [])) for r in rs]
            cols.append(f"{np.nanmean(vals):.3f}" if np.isfinite(vals).any() else "-")
        gmax = [np.nanmax(r["curves"]["grad_norm"]) for r in rs if r["curves"].get("grad_norm")]
        cols.append(f"{np.max(gmax):.3g}" if gmax else "-")
        reasons = [(r["name"], instability(r["curves"], rule)) for r in rs]
        flagged += [(name, why) for name, why in reasons if why]
        cols.append(f"{sum(bool(w) for _, w in reasons)}/{len(rs)}")
        lines.append(f"| {g} | " + " | ".join(cols) + " |")
    lines += ["", "Final values: mean over the last 10% of steps, then over seeds. Unbiased KL grad: whether the "
              "configuration's expected gradient is that of the sequence-level reverse KL (`kljax kl-configs`), "
              "on-policy / with a stale sampler (async variants).", ""]

    # Instability.
    lines += ["## Unstable runs", "", rule.describe(), ""]
    if flagged:
        lines += ["| run | why |", "|---|---|"] + [f"| {n} | {'; '.join(w)} |" for n, w in flagged]
    else:
        lines += ["No run is unstable under this rule."]
    failed = [r for r in runs if r.get("error")]
    if failed:
        lines += ["", "Runs that raised an error: " + ", ".join(r["name"] for r in failed)]
    out = sweep_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out
