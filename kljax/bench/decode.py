"""`kljax bench decode`: kljax's jitted sampler vs transformers' `generate`, same weights, same shapes.

    kljax bench decode [--model DIR] [--batch 32] [--prompt-len 64] [--new-tokens 128]
                       [--repeats 5] [--modes greedy,sampled] [--dtype float32] [--json PATH]

Both sides get the same B random prompts of exactly `--prompt-len` tokens and produce exactly
`--new-tokens` tokens per row: kljax with no stop ids, transformers with
`min_new_tokens = max_new_tokens` (so EOS cannot end it early). Speed is end to end (prefill +
decode) in generated tokens per second, B * new_tokens / seconds, the median over `--repeats` timed
runs after `--warmup` untimed ones; kljax and transformers runs alternate so that a change in the
machine's load hits both. kljax's compile time (XLA backend compile, measured by JAX's own
monitoring events) is reported apart. transformers runs on PyTorch CPU with
`torch.set_num_threads(--peer-threads, default: the core count)` under `torch.inference_mode()`.

The JSON has `kljax`, `peer` (tokens/s, geometric mean over the modes) and `ratio` = kljax / peer,
plus per-mode details, the settings, versions and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

MODES = ("greedy", "sampled")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint directory (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--batch", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side and mode (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per side and mode first")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of greedy,sampled")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampled mode temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampled mode top-p (1 = off)")
    parser.add_argument("--top-k", type=int, default=0, help="sampled mode top-k (0 = off)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights and compute dtype, on both sides")
    parser.add_argument("--peer-threads", type=int, default=None,
                        help="torch threads for transformers (default: the core count)")
    parser.add_argument("--no-peer", action="store_true", help="time kljax only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", help="write the results here")


def _tokens_per_s(rows: int, new_tokens: int, timings: list[tuple[float, float]]) -> dict[str, Any]:
    """Median and spread of tokens/s from (wall seconds, process CPU seconds) per run."""
    seconds = [wall for wall, _ in timings]
    speeds = sorted(rows * new_tokens / s for s in seconds)
    quartiles = statistics.quantiles(speeds, n=4, method="inclusive") if len(speeds) > 1 else [speeds[0]] * 3
    return {
        "tokens_per_s": statistics.median(speeds),
        "min": speeds[0], "max": speeds[-1], "q1": quartiles[0], "q3": quartiles[2],
        "seconds": [round(s, 4) for s in seconds],
        "cpu_seconds": [round(c, 4) for _, c in timings],
        "cpu_seconds_per_token": statistics.median(c for _, c in timings) / (rows * new_tokens),
    }


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _validate(args: argparse.Namespace) -> list[str]:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"--modes must be a comma-separated subset of {','.join(MODES)}; got {args.modes!r}")
    for name in ("batch", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    return modes


def run(args: argparse.Namespace) -> int:
    modes = _validate(args)
    import jax
    import numpy as np

    from kljax import sampling
    from kljax.models.convert import load_hf_checkpoint
    from kljax.models.default import default_model_dir

    model_dir = Path(args.model) if args.model else default_model_dir()
    params, config = load_hf_checkpoint(model_dir, param_dtype=args.dtype, dtype=args.dtype)
    b, p, n = args.batch, args.prompt_len, args.new_tokens
    rng = np.random.default_rng(args.seed)
    low = min(100, config.vocab_size - 1)  # skip the special tokens at the start of most vocabularies
    prompts = rng.integers(low, config.vocab_size, (b, p)).astype(np.int32)
    pad = config.pad_token_id if config.pad_token_id is not None else 0

    compile_seconds: list[float] = []

    def on_duration(event: str, duration: float, **_: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compile_seconds.append(duration)

    jax.monitoring.register_event_duration_secs_listener(on_duration)

    def sampling_params(mode: str) -> sampling.SamplingParams:
        if mode == "greedy":
            return sampling.SamplingParams(max_new_tokens=n, greedy=True)
        return sampling.SamplingParams(max_new_tokens=n, temperature=args.temperature, top_p=args.top_p,
                                       top_k=args.top_k)

    def kljax_once(mode: str, seed: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        out = sampling.generate(params, config, prompts, None, jax.random.key(seed), sampling_params(mode))
        out.response_tokens_rn.block_until_ready()
        return time.perf_counter() - t0, time.process_time() - c0

    peer_once = None if args.no_peer else _make_peer(model_dir, args, prompts, pad, n)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    for mode in modes:
        before = len(compile_seconds)
        first, _ = kljax_once(mode, 0)
        compile_s = sum(compile_seconds[before:])
        for i in range(args.warmup):
            kljax_once(mode, 1 + i)
            if peer_once:
                peer_once(mode, 1 + i)
        ours, theirs = [], []
        for i in range(args.repeats):
            ours.append(kljax_once(mode, 100 + i))
            if peer_once:
                theirs.append(peer_once(mode, 100 + i))
        row: dict[str, Any] = {
            "kljax": _tokens_per_s(b, n, ours),
            "kljax_compile_s": round(compile_s, 3),
            "kljax_first_call_s": round(first, 3),
        }
        if peer_once:
            row["peer"] = _tokens_per_s(b, n, theirs)
            row["ratio"] = row["kljax"]["tokens_per_s"] / row["peer"]["tokens_per_s"]
        results[mode] = row
        _print_row(mode, row)

    summary: dict[str, Any] = {"kljax": _geomean([r["kljax"]["tokens_per_s"] for r in results.values()])}
    if peer_once:
        summary["peer"] = _geomean([r["peer"]["tokens_per_s"] for r in results.values()])
        summary["ratio"] = summary["kljax"] / summary["peer"]
        print(f"overall (geometric mean over modes): kljax {summary['kljax']:.1f} tok/s, "
              f"transformers {summary['peer']:.1f} tok/s, ratio {summary['ratio']:.2f}x")
    summary.update(
        unit="generated tokens per second (end to end: prefill + decode)",
        modes=results,
        settings={
            "model": str(model_dir), "batch": b, "prompt_len": p, "new_tokens": n, "repeats": args.repeats,
            "warmup": args.warmup, "dtype": args.dtype, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "peer_threads": None if args.no_peer else (args.peer_threads or cores),
        },
        machine={
            "cpu_count": cores, "platform": platform.platform(), "jax_backend": jax.default_backend(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        },
        versions=_versions(),
    )
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


def _make_peer(model_dir: Path, args: argparse.Namespace, prompts: Any, pad: int, n: int):
    """A function (mode, seed) -> (wall, CPU) seconds of transformers' generate on the same prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.peer_threads or os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
    input_ids = torch.from_numpy(prompts.astype("int64"))
    attention_mask = torch.ones_like(input_ids)

    def once(mode: str, seed: int) -> tuple[float, float]:
        kwargs: dict[str, Any] = dict(do_sample=False)
        if mode == "sampled":
            kwargs = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
        torch.manual_seed(seed)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=n, min_new_tokens=n,
                pad_token_id=pad, **kwargs,
            )
        seconds = time.perf_counter() - t0, time.process_time() - c0
        if out.shape[1] != input_ids.shape[1] + n:
            raise RuntimeError(f"transformers generated {out.shape[1] - input_ids.shape[1]} tokens, not {n}")
        return seconds

    return once


def _print_row(mode: str, row: dict[str, Any]) -> None:
    k = row["kljax"]
    line = (f"{mode:8s} kljax {k['tokens_per_s']:8.1f} tok/s [{k['min']:.1f}-{k['max']:.1f}]"
            f" {1e3 * k['cpu_seconds_per_token']:.1f} cpu-ms/tok (compile {row['kljax_compile_s']:.1f}s)")
    if "peer" in row:
        t = row["peer"]
        line += f"  transformers {t['tokens_per_s']:8.1f} tok/s [{t['min']:.1f}-{t['max']:.1f}]"
        line += f" {1e3 * t['cpu_seconds_per_token']:.1f} cpu-ms/tok"
        line += f"  ratio {row['ratio']:.2f}x"
    print(line, flush=True)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("jax", "jaxlib", "torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out
