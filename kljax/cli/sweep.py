"""`kljax sweep --config configs/sweep_X.py --out SWEEP_DIR [--parallel N] [--config.field=value ...]`.

Runs the grid of a sweep config (see `kljax.studies.sweep`), skipping finished runs and resuming unfinished
ones, and writes SWEEP_DIR/summary.json; then `kljax report SWEEP_DIR`. Overrides apply to every run.
"""

from __future__ import annotations

import argparse
import sys

from kljax.studies.sweep import load_sweep, run_status, run_sweep

ACCEPTS_CONFIG_OVERRIDES = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="sweep config (configs/sweep_*.py, configs/experiment_*.py)")
    parser.add_argument("--out", required=True, help="sweep directory (runs/, summary.json, report.md)")
    parser.add_argument("--parallel", type=int, default=0,
                        help="run N `kljax train` subprocesses at a time (default 0: one after another, in-process)")
    parser.add_argument("--list", action="store_true", help="print the grid and each run's status, run nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.epilog = "Overrides (--config.steps=50) change every run of the grid; finished runs are not rerun."


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.parallel < 0:
        print(f"kljax sweep: error: --parallel={args.parallel} must be >= 0 (0: one run after another)",
              file=sys.stderr)
        return 2
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"kljax sweep: error: --out {args.out} is an existing file; give a directory", file=sys.stderr)
        return 2
    try:
        sweep = load_sweep(args.config, getattr(args, "overrides", []))
    except ValueError as e:
        print(f"kljax sweep: error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for p in sweep.points:
            status = "unsupported" if p.unsupported else run_status(Path(args.out) / "runs" / p.name)
            print(f"{p.name:<40} {status}")
        return 0
    actions = run_sweep(sweep, args.out, parallel=args.parallel, progress=not args.no_progress)
    counts = {a: sum(v == a for v in actions.values()) for a in sorted(set(actions.values()))}
    print("sweep done: " + ", ".join(f"{n} {a}" for a, n in counts.items()))
    for p in sweep.points:
        if p.unsupported:
            print(f"  not supported by the trainer yet: {p.name}")
    failed = [n for n, a in actions.items() if a == "failed"]
    for name in failed:
        print(f"  failed: {name} (see {Path(args.out) / 'runs' / name})", file=sys.stderr)
    print(f"summary: {Path(args.out) / 'summary.json'}; next: kljax report {args.out}")
    return 1 if failed else 0
