"""`kljax converge-study`: KL configurations trained to the known optimum of toy tasks.

Examples:
  kljax converge-study --quick --json runs/converge-quick.json     # 4 presets x 2 seeds, 2 staleness levels
  kljax converge-study --out runs/converge && kljax report runs/converge
  kljax converge-study --presets k1-reward,k3-loss --betas 0.1 --seeds 3 --async-levels 0,10 --steps 100

--out DIR gets study.json (meta and one row per preset x async level x beta) and curves.json
(per row: gap, kl_seq, reward at every step for every seed, 4 significant digits); `kljax report DIR`
renders them.
--json PATH gets the rows alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from kljax.errors import UserError
from kljax.studies.study import StudyConfig, run_study


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a few presets (none, k1-reward, k3-loss, k1-loss), 2 seeds, async 0 and 4, 200 steps")
    parser.add_argument("--out", default=None, help="directory for study.json and curves.json (for `kljax report`)")
    parser.add_argument("--json", default=None, help="write the rows (one per configuration) as a JSON list here")
    parser.add_argument("--presets", default=None, help="comma-separated preset names (default: all, see kl-configs)")
    parser.add_argument("--betas", default=None, help="comma-separated betas (default 0.05,0.1,0.3,1)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 5, quick 2)")
    parser.add_argument("--async-levels", default=None, help="comma-separated sampler staleness (default 0,4,10)")
    parser.add_argument("--steps", type=int, default=None, help="training iterations per run (default 300)")
    parser.add_argument("--policy", default=None, choices=("tabular", "transformer"),
                        help="the tabular policy (default) or a tiny random transformer over the same tokens")
    parser.add_argument("--learning-rate", type=float, default=None, help="AdamW's peak learning rate (default 0.1)")
    parser.add_argument("--fixed-point-iters", type=int, default=None,
                        help="expected-gradient ascent steps for each fixed point (default 4000; 0: skip)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _num(x: float | None) -> str:
    return "      nan" if x is None else f"{x:9.4f}"


def _list(text: str, kind: type, flag: str) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--{flag}={text!r}: give comma-separated {kind.__name__} values") from None


def build_config(args: argparse.Namespace):
    """The StudyConfig of the command line (full or --quick, then the explicit overrides)."""

    cfg = StudyConfig.quick() if args.quick else StudyConfig.full()
    changes = {}
    if args.presets:
        changes["presets"] = _list(args.presets, str, "presets")
    if args.betas:
        changes["betas"] = _list(args.betas, float, "betas")
    if args.async_levels:
        changes["async_levels"] = _list(args.async_levels, int, "async-levels")
    if args.policy:
        changes["policy"] = args.policy
    if args.learning_rate is not None:
        if not args.learning_rate > 0:
            raise UserError(f"--learning-rate={args.learning_rate} must be > 0")
        changes["learning_rate"] = args.learning_rate
    if args.fixed_point_iters is not None:
        if args.fixed_point_iters < 0:
            raise UserError(f"--fixed-point-iters={args.fixed_point_iters} must be >= 0")
        changes["fixed_point_iters"] = args.fixed_point_iters
    for name in ("seeds", "steps"):
        if getattr(args, name) is not None:
            if getattr(args, name) < 1:
                raise UserError(f"--{name}={getattr(args, name)} must be >= 1")
            changes[name] = getattr(args, name)
    return dataclasses.replace(cfg, **changes)


def _finite(value):
    """NaN and infinities as JSON null (the project's JSON never holds NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _significant(array, digits: int = 4) -> list:
    """`array` as nested lists of floats rounded to `digits` significant digits (curves.json holds
    every step of every seed: full float repr would make it ~5x larger for no visible difference)."""
    import numpy as np

    return [_significant(a, digits) for a in array] if np.ndim(array) > 1 else \
        [float(f"{x:.{digits}g}") for x in np.asarray(array, float)]


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is an existing file; give a directory")
    if args.json and Path(args.json).is_dir():
        raise UserError(f"--json {args.json} is a directory; give a file path")
    cfg = build_config(args)
    total = len(cfg.presets) * len(cfg.async_levels)
    with tqdm(total=total, desc="converge-study", unit="config", disable=args.no_progress, file=sys.stderr) as bar:
        result = run_study(cfg, progress=lambda label: (bar.set_postfix_str(label), bar.update(1)))
    rows = _finite(result["rows"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "study.json").write_text(json.dumps(_finite({"meta": result["meta"], "rows": rows}), indent=1) + "\n")
        curves = _finite({name: {k: _significant(v) for k, v in c.items()} for name, c in result["curves"].items()})
        (out / "curves.json").write_text(json.dumps(curves) + "\n")
    width = max(len(r["name"]) for r in rows)
    print(f"{'configuration':<{width}}  verdict   initial gap   final gap (mean +- std)   ended at")
    for r in rows:
        flag = f"  UNSTABLE ({r['unstable_reason']})" if r["unstable"] else ""
        print(f"{r['name']:<{width}}  {r['verdict']:<8}  {r['initial_gap']:11.4f}   "
              f"{_num(r['final_gap_mean'])} +- {_num(r['final_gap_std'])}       {r['converged_to']}{flag}")
    print(f"runtime {result['meta']['runtime_s']:.0f} s")
    return 0
