"""`kljax report SWEEP_DIR`: SWEEP_DIR/report.md with tables and PNG figures (see `kljax.studies.report`)."""

from __future__ import annotations

import argparse
import sys

from kljax.studies.converge_report import is_converge_dir, write_converge_report
from kljax.studies.report import write_report


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir", help="a `kljax sweep` or `kljax converge-study --out` directory")
    parser.add_argument("--smooth", type=float, default=0.05,
                        help="moving-average window of the curves, as a fraction of the steps (default 0.05)")


def run(args: argparse.Namespace) -> int:

    try:
        if is_converge_dir(args.sweep_dir):  # a `kljax converge-study --out DIR` directory
            path = write_converge_report(args.sweep_dir)
        else:
            path = write_report(args.sweep_dir, smooth_fraction=args.smooth)
    except ValueError as e:
        print(f"kljax report: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
