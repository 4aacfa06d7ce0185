"""`kljax bench decode`: kljax's jitted sampler vs transformers' `generate`, same weights, same shapes.

    kljax bench decode [--model DIR|random:NAME] [--batch 32] [--prompt-len 64] [--new-tokens 128]
                       [--repeats 5] [--modes greedy,sampled] [--dtype float32] [--peak-gflops G]
                       [--no-floor] [--json PATH]

Both sides get the same B random prompts of exactly `--prompt-len` tokens and produce exactly
`--new-tokens` tokens per row: kljax with no stop ids, transformers with
`min_new_tokens = max_new_tokens` (so EOS cannot end it early). Speed is end to end (prefill +
decode) in generated tokens per second, B * new_tokens / seconds, the median over `--repeats` timed
runs after `--warmup` untimed ones; kljax and transformers runs alternate so that a change in the
machine's load hits both. kljax's compile time (XLA backend compile, measured by JAX's own
monitoring events) is reported apart. transformers runs under `torch.inference_mode()` on the GPU
when PyTorch has CUDA, else on the CPU with `torch.set_num_threads(--peer-threads, default: the
core count)`. `--model random:NAME` (see `benchmarks.common`) gives both sides the same
random-init weights.

MFU, for both sides: model FLOPs per generate / seconds / peak, with the model FLOPs those of
`common.sample_flops`, 2 N (B P + B n) + 2 H B n (N non-embedding parameters, H = V * D the head,
n = --new-tokens), the same nominal work for both sides, and the peak a matmul in `--dtype` measured
in the same run (`common.peak_gflops`) or `--peak-gflops`. It bounds what any sampler can reach on
the machine: a speed ratio r over the peer needs MFU r times the peer's.

The matmul floor (`benchmarks.decode_floor`; `--no-floor` skips it): the prefill plus the decode
steps' weight matmuls alone, timed on this machine. No sampler on these kernels generates faster
than its `tokens_per_s`; the table shows each side's speed as a share of it and the speed that 2x
the peer would take.

The JSON has `kljax`, `peer` (tokens/s, geometric mean over the modes), `ratio` = kljax / peer,
`mfu` and `peer_mfu` (at those speeds), `peak_gflops`, `floor`, plus per-mode details, the
settings, versions and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from benchmarks import common

MODES = ("greedy", "sampled")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint directory, or random:NAME[:field=value,...] (a random-init "
                        "kljax.models.known_configs model; default: the embedded SmolLM2-135M-Instruct)")
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
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="peak GFLOP/s for MFU (default: measure a jitted matmul in --dtype now)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip timing the matmul floor (prefill + the decode steps' weight matmuls alone)")
    parser.add_argument("--peer-threads", type=int, default=None,
                        help="torch threads for transformers (default: the core count)")
    common.add_run_flags(parser)


def _validate(args: argparse.Namespace) -> list[str]:
    modes = common.parse_subset(args.modes, MODES, "--modes")
    common.check_counts(args, ("batch", "prompt_len", "new_tokens", "repeats"))
    common.check_peak_gflops(args.peak_gflops)
    return modes


def run(args: argparse.Namespace) -> int:
    modes = _validate(args)
    import jax
    import numpy as np

    from kljax import sampling

    model = common.load_model(args.model, export_for_peer=not args.no_peer, param_dtype=args.dtype, dtype=args.dtype)
    params, config = model.params, model.config
    b, p, n = args.batch, args.prompt_len, args.new_tokens
    rng = np.random.default_rng(args.seed)
    low = min(100, config.vocab_size - 1)  # skip the special tokens at the start of most vocabularies
    prompts = rng.integers(low, config.vocab_size, (b, p)).astype(np.int32)
    pad = config.pad_token_id if config.pad_token_id is not None else 0

    compiles = common.CompileTimer()
    n_body, n_head = common.body_and_head_params(
        sum(x.size for x in jax.tree.leaves(params)), config.vocab_size, config.hidden_size, config.tie_embeddings
    )
    flops = common.sample_flops(n_body, n_head, b * p, b * n)

    def sampling_params(mode: str) -> sampling.SamplingParams:
        if mode == "greedy":
            return sampling.SamplingParams(max_new_tokens=n, greedy=True)
        return sampling.SamplingParams(max_new_tokens=n, temperature=args.temperature, top_p=args.top_p,
                                       top_k=args.top_k)

    def kljax_once(mode: str, seed: int) -> common.Timing:
        return common.timed(lambda: sampling.generate(
            params, config, prompts, None, jax.random.key(seed), sampling_params(mode)
        ).response_tokens_rn.block_until_ready())

    peer_once = None if args.no_peer else _make_peer(model.hf_dir, args, prompts, pad, n)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    peak = common.peak_gflops(args.peak_gflops, args.dtype)
    mfu = lambda tokens_per_s: flops * tokens_per_s / (b * n) / (peak["gflops"] * 1e9)
    for mode in modes:
        mark = compiles.mark()
        first, _ = kljax_once(mode, 0)
        compile_s = compiles.since(mark)
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
            "kljax": common.throughput(b * n, ours),
            "kljax_compile_s": round(compile_s, 3),
            "kljax_first_call_s": round(first, 3),
        }
        row["kljax_mfu"] = mfu(row["kljax"]["tokens_per_s"])
        if peer_once:
            row["peer"] = common.throughput(b * n, theirs)
            row["ratio"] = row["kljax"]["tokens_per_s"] / row["peer"]["tokens_per_s"]
            row["peer_mfu"] = mfu(row["peer"]["tokens_per_s"])
        results[mode] = row
        _print_row(mode, row)

    summary: dict[str, Any] = {"kljax": common.geomean([r["kljax"]["tokens_per_s"] for r in results.values()])}
    summary["mfu"] = mfu(summary["kljax"])
    if peer_once:
        summary["peer"] = common.geomean([r["peer"]["tokens_per_s"] for r in results.values()])
        summary["ratio"] = summary["kljax"] / summary["peer"]
        summary["peer_mfu"] = mfu(summary["peer"])
        print(f"overall (geometric mean over modes): kljax {summary['kljax']:.1f} tok/s, "
              f"transformers {summary['peer']:.1f} tok/s, ratio {summary['ratio']:.2f}x")
    print(f"MFU: {flops / 1e9:.1f} model GFLOP per generate, peak {peak['gflops']:.0f} GFLOP/s ({args.dtype}, "
          f"{peak['source']}); kljax {summary['mfu']:.2f}"
          + (f", transformers {summary['peer_mfu']:.2f} (a 2x ratio needs MFU {2 * summary['peer_mfu']:.2f})"
             if peer_once else ""))
    summary.update(peak_gflops=peak["gflops"], model_flops_per_generate=flops, peak=peak)
    if not args.no_floor:
        from benchmarks import decode_floor

        floor = decode_floor.matmul_floor(params, config, prompts, n, repeats=min(args.repeats, 3))
        summary["floor"] = floor
        line = (f"matmul floor: prefill {floor['prefill_s']:.2f} s + decode weight matmuls "
                f"{floor['decode_matmul_s']:.2f} s = {floor['tokens_per_s']:.1f} tok/s; "
                f"kljax at {summary['kljax'] / floor['tokens_per_s']:.0%} of it")
        if peer_once:
            line += (f", transformers at {summary['peer'] / floor['tokens_per_s']:.0%}; 2x transformers "
                     f"= {2 * summary['peer'] / floor['tokens_per_s']:.0%} of it")
        print(line)
    summary.update(
        unit="generated tokens per second (end to end: prefill + decode)",
        modes=results,
        settings={
            "model": model.name, "batch": b, "prompt_len": p, "new_tokens": n, "repeats": args.repeats,
            "warmup": args.warmup, "dtype": args.dtype, "temperature": args.temperature, "top_p": args.top_p,
            "top_k": args.top_k, "peer_threads": None if args.no_peer else (args.peer_threads or cores),
        },
        machine=common.machine_info(load_before),
        versions=common.versions(),
    )
    common.write_json(args.json_path, summary)
    return 0


def _make_peer(model_dir: Path, args: argparse.Namespace, prompts: Any, pad: int, n: int):
    """A function (mode, seed) -> (wall, CPU) seconds of transformers' generate on the same prompts
    (on the GPU when this PyTorch build has CUDA)."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks import torch_losses

    torch.set_num_threads(args.peer_threads or os.cpu_count() or 1)
    device = torch_losses.default_device()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).to(device).eval()
    input_ids = torch.from_numpy(prompts.astype("int64")).to(device)
    attention_mask = torch.ones_like(input_ids)

    def once(mode: str, seed: int) -> common.Timing:
        kwargs: dict[str, Any] = dict(do_sample=False)
        if mode == "sampled":
            kwargs = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
        torch.manual_seed(seed)
        out = []

        def generate() -> None:
            with torch.inference_mode():
                out.append(model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=n, min_new_tokens=n,
                    pad_token_id=pad, **kwargs,
                ))
            torch_losses.sync(device)

        seconds = common.timed(generate)
        if out[0].shape[1] != input_ids.shape[1] + n:
            raise RuntimeError(f"transformers generated {out[0].shape[1] - input_ids.shape[1]} tokens, not {n}")
        return seconds

    return once


def _print_row(mode: str, row: dict[str, Any]) -> None:
    k = row["kljax"]
    line = (f"{mode:8s} kljax {k['tokens_per_s']:8.1f} tok/s [{k['min']:.1f}-{k['max']:.1f}]"
            f" {1e3 * k['cpu_seconds_per_token']:.1f} cpu-ms/tok MFU {row['kljax_mfu']:.2f}"
            f" (compile {row['kljax_compile_s']:.1f}s)")
    if "peer" in row:
        t = row["peer"]
        line += f"  transformers {t['tokens_per_s']:8.1f} tok/s [{t['min']:.1f}-{t['max']:.1f}]"
        line += f" {1e3 * t['cpu_seconds_per_token']:.1f} cpu-ms/tok MFU {row['peer_mfu']:.2f}"
        line += f"  ratio {row['ratio']:.2f}x"
    print(line, flush=True)

