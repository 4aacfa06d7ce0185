"""`kljax bench <benchmark>`: kljax against the tool a user would otherwise pick.

    kljax bench decode [--batch 32 --prompt-len 64 --new-tokens 128 --repeats 5 --json out.json]
    kljax bench train  [--batch 16 --seq-len 256 --response-len 128 --dtype float32 --peak-gflops G]
    kljax bench kl     [--batch 64 --seq-len 1024 --full-batch 1 --full-len 64 --vocab 151936]

Every benchmark takes `--model` where a model is involved (an HF dir, the embedded SmolLM2 by
default, or `random:NAME` from `kljax.models.known_configs`), `--repeats`/`--warmup`, `--no-peer`
and `--json PATH`, and reports kljax's speed, the peer's, and `ratio` = kljax / peer; shared
pieces live in `benchmarks.common`. `launch/bench_gpu.sh` runs them all on one GPU host.

Each benchmark is a module with `configure(parser)` and `run(args) -> int`; add a row to
`BENCHMARKS` to add one. Heavy imports happen inside `run`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util

from kljax.errors import UserError

# name -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "decode": ("benchmarks.decode", "sampler tokens/s: kljax's jitted decode loop vs transformers' generate"),
    "train": ("benchmarks.train", "policy-update tokens/s, MFU: kljax's jitted train step vs transformers + AdamW"),
    "kl": ("benchmarks.kl", "KL estimators, losses and the full-vocabulary KL: kljax (jit) vs PyTorch eager"),
    "rl": ("benchmarks.rl", "seconds per RL iteration (sample, reward, score, update): kljax vs TRL's GRPOTrainer"),
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
    missing = [name for name in ("torch", "transformers", "trl") if importlib.util.find_spec(name) is None]
    if missing and not getattr(args, "no_peer", False):
        raise UserError(f"kljax bench needs {', '.join(missing)}: pip install -e '.[bench]'")
    return int(importlib.import_module(args._bench_module).run(args) or 0)
