"""`kljax bench kl`: KL estimators and losses alone, jitted kljax vs PyTorch eager, forward + backward.

    kljax bench kl [--batch 64 --seq-len 1024 --iters 20] [--full-batch 1 --full-len 64
                   --full-chunk 16 --hidden 896 --vocab 151936] [--repeats 5] [--json PATH]

Per-token cases, on [B, T] = [64, 1024] float32 log-probs with random response lengths (masked):
  k1, k2, k3      sum_bt k(logp - ref_logp) * mask, and its gradient in logp (kljax.rl.estimators);
  kl_terms        sum_b loss_b of KLConfig(k3, placement loss)                    (kljax.rl.kl.kl_terms);
  kl_surrogate    sum_b of kl_surrogate(KLConfig(k3, both, reward_to_go)), with a sampler
                  distinct from the policy (token ratios != 1)                     (kljax.rl.objective.kl_surrogate).
One timed repeat is `--iters` calls (dispatched back to back, waited for at the end).

Full-vocabulary KL, sum_v p(v|h) log(p(v|h) / p_ref(v|h)) at every position from hidden states
h, h_ref [Bf, Tf, D] and tied unembeddings W, W_ref [V, D] (default V = 151936, D = 896: Qwen2.5-0.5B),
gradient in (W, h), at a smaller shape [Bf, Tf] = [1, 64] (set it with --full-batch/--full-len; each
call is ~100 GFLOP there, seconds on 2 CPU cores; on a GPU use e.g. 4 x 1024 with --full-chunk 256):
  full_kl_chunked  kljax.policies.transformer.full_kl_from_hidden, `--full-chunk` positions per slice,
                   rematerialized (PyTorch: the same slices under torch.utils.checkpoint);
  full_kl_naive    both [Bf, Tf, V] logits at once (kljax.rl.estimators.full_kl_from_logits).
Memory: XLA's compiled memory_analysis() of each jitted kljax function (argument, output and temp
bytes), at the timed shape and, compile-only, at `--memory-batch` x `--memory-len` (default 4 x 1024);
on CUDA also PyTorch's max_memory_allocated. The chunked backward holds a [V, D] float32 gradient
accumulator (the `lax.map` carry) besides the output gradient, a fixed ~0.5 GiB at V = 151936,
D = 896: at 1 x 64 positions it needs more temp memory than the naive version, at 4 x 1024 far less.
The first call's values and gradients of both sides are compared (`check` per case); a mismatch exits 1.

Speed: tokens/s (positions processed per second), median over `--repeats`; `kljax`/`peer` in the
JSON are geometric means over the cases, `ratio` = kljax / peer. MFU does not apply (null).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks import common

TOKEN_CASES = ("k1", "k2", "k3", "kl_terms", "kl_surrogate")
FULL_CASES = ("full_kl_chunked", "full_kl_naive")
CASES = TOKEN_CASES + FULL_CASES


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=64, help="sequences of the per-token cases")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence of the per-token cases")
    parser.add_argument("--iters", type=int, default=20, help="calls per timed repeat of the per-token cases")
    parser.add_argument("--full-batch", type=int, default=1, help="sequences of the full-vocabulary KL")
    parser.add_argument("--full-len", type=int, default=64, help="positions per sequence of the full-vocabulary KL")
    parser.add_argument("--full-chunk", type=int, default=16, help="positions per slice of the chunked full KL")
    parser.add_argument("--hidden", type=int, default=896, help="hidden size D of the full-vocabulary KL")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size V of the full-vocabulary KL")
    parser.add_argument("--memory-batch", type=int, default=4, help="batch of the compile-only memory analysis")
    parser.add_argument("--memory-len", type=int, default=1024,
                        help="positions of the compile-only memory analysis (0: skip it)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype of h and W in the full KL (log-ratios and softmax are float32 always)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per side and case (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed repeats per side and case first")
    parser.add_argument("--peer-threads", "--threads", dest="peer_threads", type=int, default=None,
                        help="torch threads (default: the core count)")
    common.add_run_flags(parser)


def _validate(args: argparse.Namespace) -> list[str]:
    cases = common.parse_subset(args.cases, CASES, "--cases")
    common.check_counts(args, ("batch", "seq_len", "iters", "full_batch", "full_len", "full_chunk", "hidden", "vocab",
                               "repeats"), ("warmup", "memory_batch", "memory_len"))
    return cases


def run(args: argparse.Namespace) -> int:
    cases = _validate(args)
    import jax
    import numpy as np

    from benchmarks import kl_cases

    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    token_inputs = kl_cases.token_inputs(rng, args.batch, args.seq_len)
    full_inputs = kl_cases.full_inputs(rng, args.full_batch, args.full_len, args.hidden, args.vocab, args.dtype)
    torch_mod = None
    if not args.no_peer:
        import torch as torch_mod

        from benchmarks import torch_losses

        torch_mod.set_num_threads(args.peer_threads or os.cpu_count() or 1)
        device = torch_losses.default_device()
    rows: dict[str, dict[str, Any]] = {}
    checks_ok = True
    for case in cases:
        full = case in FULL_CASES
        inputs = full_inputs if full else token_inputs
        fn = kl_cases.jax_case(case, args.full_chunk, args.dtype)
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*inputs).compile()
        compile_s = time.perf_counter() - t0
        iters = 1 if full else args.iters
        units = iters * inputs[0].shape[0] * inputs[0].shape[1]

        def ours_once(compiled=compiled, inputs=inputs, iters=iters) -> None:
            out = None
            for _ in range(iters):
                out = compiled(*inputs)
            jax.block_until_ready(out)

        first_jax = jax.device_get(compiled(*inputs))
        peer_once, first_peer, peer_mem = None, None, None
        if torch_mod is not None:
            peer_fn, peer_inputs = kl_cases.torch_case(case, inputs, args.full_chunk, device)
            if device == "cuda":
                torch_mod.cuda.reset_peak_memory_stats()
            first_peer = peer_fn(*peer_inputs)
            if device == "cuda":
                peer_mem = int(torch_mod.cuda.max_memory_allocated())

            def peer_once(peer_fn=peer_fn, peer_inputs=peer_inputs, iters=iters) -> None:
                for _ in range(iters):
                    peer_fn(*peer_inputs)
                torch_losses.sync(device)

        for _ in range(args.warmup):
            ours_once()
            if peer_once:
                peer_once()
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(common.timed(ours_once))
            if peer_once:
                theirs.append(common.timed(peer_once))
        row: dict[str, Any] = {"kljax": common.throughput(units, ours), "kljax_compile_s": round(compile_s, 3),
                               "shape": list(inputs[0].shape[:2]), "memory": kl_cases.memory(compiled)}
        if full and args.memory_len:
            shape_fn = kl_cases.jax_case(case, args.full_chunk, args.dtype)
            abstract = kl_cases.full_input_shapes(args.memory_batch, args.memory_len, args.hidden, args.vocab,
                                                  args.dtype)
            row["memory_at"] = {"shape": [args.memory_batch, args.memory_len],
                                **kl_cases.memory(jax.jit(shape_fn).lower(*abstract).compile())}
        if peer_once:
            row["peer"] = common.throughput(units, theirs)
            row["ratio"] = row["kljax"]["tokens_per_s"] / row["peer"]["tokens_per_s"]
            row["peer_device_peak_bytes"] = peer_mem
            row["check"] = kl_cases.compare(first_jax, first_peer, args.dtype if full else "float32")
            checks_ok &= row["check"]["ok"]
        rows[case] = row
        _print_row(case, row)

    result: dict[str, Any] = {"kljax": common.geomean([r["kljax"]["tokens_per_s"] for r in rows.values()])}
    if torch_mod is not None:
        result["peer"] = common.geomean([r["peer"]["tokens_per_s"] for r in rows.values()])
        result["ratio"] = result["kljax"] / result["peer"]
        print(f"overall (geometric mean over cases): kljax {result['kljax']:.4g} tok/s, "
              f"PyTorch {result['peer']:.4g} tok/s, ratio {result['ratio']:.2f}x")
    result.update(
        mfu=None, peer_mfu=None, unit="positions per second, forward + backward", cases=rows,
        settings={k: getattr(args, k) for k in ("batch", "seq_len", "iters", "full_batch", "full_len", "full_chunk",
                                                 "hidden", "vocab", "memory_batch", "memory_len", "dtype",
                                                 "repeats", "warmup")}
        | {"cases": cases, "peer_threads": None if args.no_peer else (args.peer_threads or os.cpu_count()),
           "peer_device": None if args.no_peer else device},
        machine=common.machine_info(load_before), versions=common.versions(),
    )
    common.write_json(args.json_path, result)
    return 0 if checks_ok else 1


def _print_row(case: str, row: dict[str, Any]) -> None:
    k = row["kljax"]
    mem = row["memory"]
    line = (f"{case:16s} {'x'.join(map(str, row['shape'])):>8s} kljax {k['tokens_per_s']:10.4g} tok/s "
            f"[{k['min']:.3g}-{k['max']:.3g}]")
    if mem["temp_bytes"] is not None:
        line += f" temp {mem['temp_bytes'] / 2**20:8.1f} MiB"
    at = row.get("memory_at", {})
    if at.get("peak_bytes") is not None:
        line += f" (peak at {'x'.join(map(str, at['shape']))}: {at['peak_bytes'] / 2**30:.2f} GiB)"
    if "peer" in row:
        t = row["peer"]
        line += f"  PyTorch {t['tokens_per_s']:10.4g} tok/s [{t['min']:.3g}-{t['max']:.3g}]  ratio {row['ratio']:.2f}x"
        if not row["check"]["ok"]:
            line += f"  MISMATCH {row['check']}"
    print(line, flush=True)
