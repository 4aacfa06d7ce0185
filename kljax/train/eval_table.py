"""The table `kljax train` prints at the end of a run: per split, greedy and sampled accuracy before,
after, and the paired change, each with its 95% interval (`kljax.train.evaluate_loop` entries).

    split       accuracy          before                after                 change (paired)
    test        greedy (argmax)   0.116 [0.090, 0.148]  0.074 [0.054, 0.100]  -0.042 [-0.066, -0.018]
                sampled T=0.8     0.050 [0.036, 0.066]  0.118 [0.096, 0.142]  +0.068 [+0.046, +0.090] *

A change marked * has an interval that excludes 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _value(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "-"
    lo, hi = entry["ci95"]
    return f"{entry.get('accuracy', entry.get('mean', float('nan'))):.3f} [{lo:.3f}, {hi:.3f}]"


def _change(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "-"
    lo, hi = entry["ci95"]
    mark = " *" if lo > 0 or hi < 0 else ""
    return f"{entry['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]{mark}"


def change_table(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The lines of the table (see the module docstring); a split evaluated without intervals (by an
    older kljax) shows its greedy accuracy only."""
    width = max([5, *(len(s) for s in after)])
    lw = 22 if any(a.get("scored_by") == "reward" for a in after.values()) else 16
    header = f"{'split':<{width}}  {'accuracy':<{lw}}  {'before':<21} {'after':<21} change (paired)"
    lines = [header]
    for split, a in after.items():
        b = before.get(split) or {}
        delta = a.get("delta_vs_before") or {}
        by_reward = a.get("scored_by") == "reward"  # no answers to check: the mean reward instead
        prefix = "reward_" if by_reward else ""
        rows = [("reward, greedy" if by_reward else "greedy (argmax)", prefix + "greedy")]
        if a.get(prefix + "sampled"):
            temperature = a[prefix + "sampled"].get("temperature")
            label = ("reward, " if by_reward else "") + "sampled"
            rows.append((label + (f" T={temperature:g}" if temperature is not None else ""), prefix + "sampled"))
        for i, (label, key) in enumerate(rows):
            name = split if i == 0 else ""
            before_entry = b.get(key) or ({"accuracy": b["accuracy"], "ci95": [float("nan")] * 2}
                                          if key == "greedy" and "accuracy" in b else None)
            lines.append(f"{name:<{width}}  {label:<{lw}}  {_value(before_entry):<21} {_value(a.get(key)):<21} "
                         f"{_change(delta.get(key))}")
    sizes = ", ".join(f"{split} {a['n']}" for split, a in after.items())
    lines.append(f"problems per split: {sizes}; [95% interval]; * the change's interval excludes 0")
    if any(a.get("scored_by") == "reward" for a in after.values()):
        lines.append("reward rows: the data has no answers to check accuracy against; its mean reward is shown")
    return lines


def kl_line(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One line on the KL to the reference over a run's metrics rows (kl_seq: the sampled responses'
    summed log-ratio log pi - log pi_ref, nats per response), or None without it."""
    kl = [float(r["kl_seq"]) for r in rows if isinstance(r.get("kl_seq"), (int, float))]
    if not kl:
        return None
    tail = kl[-max(1, len(kl) // 5):]
    return (f"KL to the reference (kl_seq, nats per response): step 1 {kl[0]:.3f}, mean of the last "
            f"{len(tail)} steps {sum(tail) / len(tail):.3f}, largest {max(kl):.3f} (step {kl.index(max(kl)) + 1})")


def brief(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The evaluation without its per-problem record and example (for the one-line JSON summary)."""
    return {split: {k: v for k, v in entry.items() if k not in ("problems", "example")}
            for split, entry in results.items()}
