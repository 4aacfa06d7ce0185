"""`kljax report SWEEP_DIR`: SWEEP_DIR/report.md with tables and PNG figures (see `kljax.report`)."""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", help="a `kljax sweep` output directory (with summary.json)")
    parser.add_argument("--smooth", type=float, default=0.05,
                        help="moving-average window of the curves, as a fraction of the steps (default 0.05)")


def run(args: argparse.Namespace) -> int:
    from kljax.report import write_report

    try:
        path = write_report(args.sweep_dir, smooth_fraction=args.smooth)
    except ValueError as e:
        print(f"kljax report: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
