"""`kljax bench <benchmark>`: kljax against the tool a user would otherwise pick.

    kljax bench decode [--batch 32 --prompt-len 64 --new-tokens 128 --repeats 5 --json out.json]

Each benchmark is a module with `configure(parser)` and `run(args) -> int`; add a row to
`BENCHMARKS` (e.g. `train`, `rl`, `kl`) to add one. Heavy imports happen inside `run`.
"""

from __future__ import annotations

import argparse
import importlib

# name -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "decode": ("kljax.bench.decode", "sampler tokens/s: kljax's jitted decode loop vs transformers' generate"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, (module, help_text) in BENCHMARKS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).configure(cmd)
        cmd.set_defaults(_bench_module=module)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "benchmark", None) is None:
        print("usage: kljax bench {" + ",".join(BENCHMARKS) + "} ...  (see kljax bench --help)")
        return 2
    return int(importlib.import_module(args._bench_module).run(args) or 0)
