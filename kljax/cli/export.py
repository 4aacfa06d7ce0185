"""`kljax export WORKDIR --out DIR [--step N]`: a run's trained policy as a Hugging Face checkpoint
(`kljax.train.export`)."""

from __future__ import annotations

import argparse

from kljax.train.export import EXPORT_DTYPES, EXPORT_FORMATS, export_run

ACCEPTS_CONFIG_OVERRIDES = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", help="a `kljax train` workdir")
    parser.add_argument("--out", required=True, help="output directory (must be new or empty, or pass --overwrite)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint step (default: the latest)")
    parser.add_argument("--dtype", choices=list(EXPORT_DTYPES), default=None,
                        help="dtype of the written tensors (default: the run's param dtype)")
    parser.add_argument("--format", dest="fmt", choices=list(EXPORT_FORMATS), default="merged",
                        help="merged: a full HF checkpoint (a LoRA run's adapters merged into the base); "
                             "peft: a LoRA run's adapters as a PEFT adapter directory for its base")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty --out that an earlier `kljax export` wrote")


def run(args: argparse.Namespace) -> int:
    out, step = export_run(args.workdir, args.out, args.step, args.dtype, args.overwrite,
                           list(getattr(args, "overrides", [])), fmt=args.fmt)
    print(f"exported step {step} of {args.workdir} to {out}")
    return 0
