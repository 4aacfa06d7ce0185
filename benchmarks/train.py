"""`kljax bench train`: one RL policy update, kljax's jitted train step vs transformers + torch AdamW.

    kljax bench train [--model DIR|random:NAME] [--batch 16] [--seq-len 256] [--response-len 128]
                      [--repeats 5] [--warmup 1] [--dtype float32] [--peak-gflops G] [--json PATH]

The work: B sequences of S tokens, a prompt of S - R tokens and a response of R (response lengths
drawn in [R/2, R], right-padded), with advantages (one per sequence) and fixed sampler and
reference log-probs (the policy's own plus noise, so the ratio clips some tokens and the KL is
not zero). One update = forward over all B x S tokens, log-probs at the R response positions, the
loss of `kljax.train.step` with KL config k3 in the loss (beta 0.05), PPO clip 0.2 and
seq-mean-token-mean aggregation (GRPO's, as the peer trainers use it),
    loss = sum_b mean_t(-min(r A, clip(r) A) + beta * k3(logp - ref_logp)) / B,
backward, global-norm clipping (1.0) and AdamW (kljax.train.state.OptimConfig defaults, lr 1e-6).
kljax runs the trainer's own `train_step`, jitted as the trainer does (donated state, under a
one-device mesh); the peer is `benchmarks.train_peer` (PyTorch eager). Both start from the same
weights, so their first-step losses must agree: the benchmark checks it (a mismatch means the two
sides do different work) and exits 1 if they do not.

Speed: trained tokens/s = B * S / seconds per update, the median over `--repeats` timed updates
after `--warmup` untimed ones. The sides run one after the other (kljax, then the peer, each with
its own warm-up) so that only one side's memory is live at a time. MFU = model FLOPs per update (formula in
`common.train_flops`) / seconds / peak, the peak measured in the same run (`common.peak_gflops`;
`--peak-gflops` for a datasheet number). kljax's compile time is reported apart.
`--breakdown` also times kljax's forward (loss only) and forward + backward alone. The matmul floor
(`benchmarks.train_floor`; `--no-floor` skips it) times the update's weight matmuls alone, forward
and backward, with kljax's own matmul: no update on these kernels trains faster than its
`tokens_per_s`, printed beside both sides' speeds and 1.2x the peer's.

Memory (`memory` in the JSON): the process's peak RSS during kljax's phase (load, compile,
updates) and during the peer's (the high-water mark is reset in between through
/proc/self/clear_refs; null where that is not available), XLA's memory analysis of the compiled
step (argument / output / temp bytes), and on a GPU each side's device peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import time
from typing import Any

from benchmarks import common

ESTIMATOR, BETA, CLIP, AGGREGATION = "k3", 0.05, 0.2, "seq-mean-token-mean"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint directory, or random:NAME[:field=value,...] "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per update")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (prompt + response)")
    parser.add_argument("--response-len", type=int, default=128, help="response tokens of the seq-len")
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per side (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates per side after the first")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="compute dtype (weights and optimizer stay float32 on both sides)")
    parser.add_argument("--remat", default="none", help="kljax model.remat policy (none, full, dots_saveable, ...)")
    parser.add_argument("--no-scan", action="store_true",
                        help="unroll kljax's layers (model.scan_layers=False) instead of a lax.scan over them")
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="peak GFLOP/s for MFU (default: measure a jitted matmul now)")
    parser.add_argument("--peer-threads", "--threads", dest="peer_threads", type=int, default=None,
                        help="torch threads for the peer (default: the core count)")
    common.add_run_flags(parser)
    parser.add_argument("--breakdown", action="store_true", help="also time kljax's forward and forward+backward")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip timing the matmul floor (the update's weight matmuls alone, forward and backward)")


def _validate(args: argparse.Namespace) -> None:
    common.check_counts(args, ("batch", "seq_len", "response_len", "repeats"))
    common.check_peak_gflops(args.peak_gflops)
    if args.response_len >= args.seq_len:
        raise ValueError(f"--response-len {args.response_len} must be < --seq-len {args.seq_len} "
                         "(at least one prompt token)")


def make_batch(params: Any, config: Any, b: int, s: int, r: int, seed: int, mesh: Any) -> dict[str, Any]:
    """One fixed RL batch as numpy arrays (the fields of `kljax.train.step.Batch` except beta).

    Random tokens [B, S] with responses of random length in [R/2, R] at the end (right-padded),
    advantages N(0, 1) per sequence, and sampler / reference log-probs = the policy's own
    log-probs (computed with `params`) + N(0, 0.1^2) noise, zero on padding.
    """
    import jax
    import numpy as np

    from kljax.policies.transformer import response_logprobs

    rng = np.random.default_rng(seed)
    low = min(100, config.vocab_size - 1)  # skip the special tokens at the start of most vocabularies
    tokens = rng.integers(low, config.vocab_size, (b, s)).astype(np.int32)
    lengths = rng.integers(max(1, r // 2), r + 1, b)
    response_mask = (np.arange(r)[None] < lengths[:, None]).astype(np.float32)
    mask = np.ones((b, s), bool)
    mask[:, s - r:] = response_mask > 0
    tokens[~mask] = config.pad_token_id if config.pad_token_id is not None else 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    with jax.set_mesh(mesh):
        logp0 = np.asarray(jax.jit(functools.partial(response_logprobs, response_len=r, model=config))(
            params, tokens, mask, positions))
    noisy = lambda: ((logp0 + 0.1 * rng.standard_normal(logp0.shape)) * response_mask).astype(np.float32)
    return {"tokens_bs": tokens, "mask_bs": mask, "positions_bs": positions, "response_mask_br": response_mask,
            "sampler_logp_br": noisy(), "ref_logp_br": noisy(),
            "advantages_br": (rng.standard_normal(b)[:, None] * response_mask).astype(np.float32)}


class KljaxRLStep:
    """The trainer's `train_step` on one fixed batch: jitted with donated state under a mesh, as
    `kljax.train.run_build.build` does, and compiled ahead of the first update (`compile()`, which
    also gives XLA's memory analysis). `step()` does one update and returns its (pre-update) loss
    and gradient norm."""

    def __init__(self, params: Any, config: Any, arrays: dict[str, Any], optim: Any, mesh: Any, seed: int = 0) -> None:
        import jax
        import jax.numpy as jnp

        from kljax.models import transformer as tfm
        from kljax.parallel import sharding as shd
        from kljax.rl.kl import KLConfig
        from kljax.train import state as st
        from kljax.train.step import Batch, StepSettings, batch_shardings, train_step

        tx = st.make_optimizer(optim)
        param_sh = shd.logical_to_sharding(tfm.logical_axes(config), tfm.param_shapes(config), mesh)
        self.state, state_sh = st.state_from_params(params, tx, param_sh, mesh, seed)
        self.settings = StepSettings(config, KLConfig(estimator=ESTIMATOR, placement="loss", beta=BETA), clip_low=CLIP,
                                     loss_aggregation=AGGREGATION)
        self.mesh = mesh
        self._fn = jax.jit(functools.partial(train_step, settings=self.settings, tx=optim),
                           out_shardings=(state_sh, None), donate_argnums=0)
        self._compiled: Any = None
        batch = Batch(**{k: jnp.asarray(v) for k, v in arrays.items()}, beta=jnp.asarray(BETA, jnp.float32))
        self.batch = jax.device_put(batch, batch_shardings(batch, mesh))

    def compile(self) -> dict[str, int]:
        """Compile the step for this state and batch; XLA's memory analysis of it (bytes)."""
        import jax

        with jax.set_mesh(self.mesh):
            self._compiled = self._fn.lower(self.state, self.batch).compile()
        ma = self._compiled.memory_analysis()
        if ma is None:
            return {}
        return {name: int(getattr(ma, f"{name}_size_in_bytes")) for name in ("argument", "output", "temp", "alias")}

    def step(self) -> dict[str, float]:
        import jax

        if self._compiled is None:
            self.compile()
        self.state, metrics = self._compiled(self.state, self.batch)
        jax.block_until_ready(self.state)
        return {k: float(metrics[k]) for k in ("loss", "grad_norm")}


def run(args: argparse.Namespace) -> int:
    _validate(args)
    import jax

    from kljax.parallel import sharding as shd
    from kljax.train.state import OptimConfig

    load_before = os.getloadavg()
    compiles = common.CompileTimer()
    mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = common.load_model(args.model, export_for_peer=not args.no_peer, mesh=mesh, seed=args.seed,
                              param_dtype="float32", dtype=args.dtype, remat=args.remat,
                              scan_layers=not args.no_scan)
    config = model.config
    b, s, r = args.batch, args.seq_len, args.response_len
    arrays = make_batch(model.params, config, b, s, r, args.seed, mesh)
    optim = OptimConfig()
    ours_step = KljaxRLStep(model.params, config, arrays, optim, mesh, args.seed)
    model.params = None  # the state holds the weights now; the step donates it
    settings = ours_step.settings
    print(f"kljax: compiling the train step ({config.num_layers} layers, batch {b} x {s})", flush=True)
    mark = compiles.mark()
    t0 = time.perf_counter()
    step_memory = ours_step.compile()
    compile_wall_s = time.perf_counter() - t0
    compile_s = compiles.since(mark)
    t0 = time.perf_counter()
    first = {"kljax": ours_step.step()}
    first_s = time.perf_counter() - t0
    ours, ours_kernel = _timed_updates(ours_step.step, args.warmup, args.repeats)
    breakdown = _breakdown(ours_step, min(args.repeats, 3), ours) if args.breakdown else None
    device_stats = jax.devices()[0].memory_stats() or {}
    rss_kljax_mb = common.peak_rss_mb()
    del ours_step  # free kljax's state and executable before the peer starts
    peer, theirs, theirs_kernel, rss_peer_mb = None, [], None, None
    if not args.no_peer:
        from benchmarks.train_peer import TorchRLStep

        reset = common.reset_peak_rss()
        peer = TorchRLStep(model.hf_dir, arrays, beta=BETA, estimator=ESTIMATOR, aggregation=settings.loss_aggregation,
                           clip_low=CLIP, clip_high=None, optim=optim, dtype=args.dtype,
                           threads=args.peer_threads or os.cpu_count())
        first["peer"] = peer.step()
        theirs, theirs_kernel = _timed_updates(peer.step, args.warmup, args.repeats)
        rss_peer_mb = common.peak_rss_mb() if reset else None
    check = _loss_check(first, args.dtype)

    flops = common.train_flops(config, b, s, r)
    peak = common.peak_gflops(args.peak_gflops, args.dtype)
    k_stats = common.throughput(b * s, ours)
    k_gflops = flops["total"] / statistics.median(w for w, _ in ours) / 1e9
    result: dict[str, Any] = {"kljax": k_stats["tokens_per_s"], "mfu": k_gflops / peak["gflops"],
                              "peak_gflops": peak["gflops"]}
    details: dict[str, Any] = {
        "kljax": k_stats, "kljax_gflops": k_gflops, "kljax_compile_s": round(compile_s, 3),
        "kljax_compile_wall_s": round(compile_wall_s, 3), "kljax_first_update_s": round(first_s, 3),
        "model_flops_per_update": flops, "kljax_kernel": ours_kernel,
    }
    if peer:
        p_stats = common.throughput(b * s, theirs)
        p_gflops = flops["total"] / statistics.median(w for w, _ in theirs) / 1e9
        result.update(peer=p_stats["tokens_per_s"], ratio=k_stats["tokens_per_s"] / p_stats["tokens_per_s"],
                      peer_mfu=p_gflops / peak["gflops"])
        details.update(peer=p_stats, peer_gflops=p_gflops, peer_kernel=theirs_kernel)
    if breakdown:
        details["breakdown"] = breakdown
    if not args.no_floor:
        from benchmarks import train_floor

        result["floor"] = train_floor.matmul_floor(config, b, s, r, repeats=min(args.repeats, 3))
    memory = {"kljax_peak_rss_mb": round(rss_kljax_mb, 1),
              "peer_peak_rss_mb": None if rss_peer_mb is None else round(rss_peer_mb, 1),
              "kljax_step_xla_bytes": step_memory, "kljax_device_peak_bytes": device_stats.get("peak_bytes_in_use"),
              "peer_device_peak_bytes": peer.peak_device_bytes() if peer else None}
    result.update(
        unit="trained tokens per second (batch * seq_len per policy update)", details=details, loss_check=check,
        peak=peak, memory=memory,
        settings={"model": model.name, "batch": b, "seq_len": s, "response_len": r, "repeats": args.repeats,
                  "warmup": args.warmup, "dtype": args.dtype, "param_dtype": "float32", "remat": args.remat,
                  "scan_layers": not args.no_scan,
                  "kl": {"estimator": ESTIMATOR, "placement": "loss", "beta": BETA}, "clip_low": CLIP,
                  "loss_aggregation": settings.loss_aggregation,
                  "optimizer": {"name": "adamw", **dataclasses.asdict(optim)},
                  "peer_threads": None if args.no_peer else (args.peer_threads or os.cpu_count()),
                  "peer_device": peer.device if peer else None},
        machine=common.machine_info(load_before), versions=common.versions(),
    )
    _print(result)
    common.write_json(args.json_path, result)
    return 0 if check is None or check["ok"] else 1


def _timed_updates(step: Any, warmup: int, repeats: int) -> tuple[list[common.Timing], dict[str, float]]:
    """`repeats` timed updates after `warmup` untimed ones, and their kernel time and page faults."""
    for _ in range(warmup):
        step()
    timings: list[common.Timing] = []
    kernel = common.kernel_usage(lambda: timings.append(common.timed(step)), repeats)
    return timings, kernel


def _loss_check(first: dict[str, dict[str, float]], dtype: str) -> dict[str, Any] | None:
    """Both sides' first-step (pre-update) loss must agree: same weights, batch and formula."""
    if "peer" not in first:
        return None
    k, p = first["kljax"], first["peer"]
    rtol = 1e-3 if dtype == "float32" else 5e-2
    diff = abs(k["loss"] - p["loss"])
    ok = diff <= 1e-4 + rtol * abs(p["loss"])
    grad_rel = abs(k["grad_norm"] - p["grad_norm"]) / max(abs(p["grad_norm"]), 1e-12)
    line = (f"loss check (first step): kljax {k['loss']:.6f}  transformers {p['loss']:.6f}  |diff| {diff:.2e}"
            f"  grad-norm rel diff {grad_rel:.1e}  -> {'OK' if ok else 'MISMATCH'}")
    print(line, flush=True)
    return {"kljax_loss": k["loss"], "peer_loss": p["loss"], "abs_diff": diff, "rtol": rtol, "atol": 1e-4, "ok": ok,
            "kljax_grad_norm": k["grad_norm"], "peer_grad_norm": p["grad_norm"], "grad_norm_rel_diff": grad_rel}


def _breakdown(update: KljaxRLStep, repeats: int, steps: list) -> dict[str, float]:
    """Median seconds (of up to 3 runs) of kljax's loss forward alone, forward + backward, and the whole update."""
    import jax

    from kljax.rl import objective
    from kljax.train import step as step_lib

    params, batch, settings, mesh = update.state.params, update.batch, update.settings, update.mesh
    den = objective.denominator(batch.response_mask_br, settings.loss_aggregation)
    loss_fn = functools.partial(step_lib._loss_fn, denominator=den, s=settings)
    fns = {"forward_s": jax.jit(lambda p, mb: loss_fn(p, mb)[0]),
           "forward_backward_s": jax.jit(lambda p, mb: jax.value_and_grad(loss_fn, has_aux=True)(p, mb))}
    out = {}
    for name, fn in fns.items():
        with jax.set_mesh(mesh):
            out[name] = common.median_seconds(lambda fn=fn: jax.block_until_ready(fn(params, batch)), repeats)
    out["update_s"] = statistics.median(w for w, _ in steps)
    out["backward_s"] = out["forward_backward_s"] - out["forward_s"]
    out["optimizer_s"] = out["update_s"] - out["forward_backward_s"]
    print("kljax breakdown (median s): " + "  ".join(f"{k[:-2]} {v:.3f}" for k, v in out.items()), flush=True)
    return out


def _print(result: dict[str, Any]) -> None:
    d = result["details"]
    k = d["kljax"]
    print(f"model FLOPs per update {d['model_flops_per_update']['total'] / 1e12:.3f} TFLOP; "
          f"peak {result['peak_gflops']:.1f} GFLOP/s ({result['peak']['source']})")
    line = (f"train   kljax {k['tokens_per_s']:8.1f} tok/s [{k['min']:.1f}-{k['max']:.1f}] "
            f"{d['kljax_gflops']:.1f} GFLOP/s MFU {result['mfu']:.3f} (compile {d['kljax_compile_s']:.1f}s)")
    if "peer" in d:
        t = d["peer"]
        line += (f"  transformers {t['tokens_per_s']:8.1f} tok/s [{t['min']:.1f}-{t['max']:.1f}] "
                 f"{d['peer_gflops']:.1f} GFLOP/s MFU {result['peer_mfu']:.3f}  ratio {result['ratio']:.2f}x")
    print(line, flush=True)
    kernel = lambda u: f"{u['sys_s_per_run']:.2f} s, {u['minor_faults_per_run']} page faults"
    line = f"kernel time per update (page faults of fresh memory): kljax {kernel(d['kljax_kernel'])}"
    if "peer" in d:
        line += f"; transformers {kernel(d['peer_kernel'])}"
    print(line, flush=True)
    if "floor" in result:
        f = result["floor"]
        line = (f"matmul floor: the update's weight matmuls alone {f['seconds']:.2f} s = "
                f"{f['tokens_per_s']:.1f} tok/s; "
                f"kljax at {k['tokens_per_s'] / f['tokens_per_s']:.0%} of it")
        if "peer" in d:
            line += (f", transformers at {d['peer']['tokens_per_s'] / f['tokens_per_s']:.0%}; 1.2x transformers "
                     f"= {1.2 * d['peer']['tokens_per_s'] / f['tokens_per_s']:.0%} of it")
        print(line, flush=True)
    m = result["memory"]
    gib = lambda v, scale=2**30: "-" if v is None else f"{v / scale:.2f} GiB"
    print(f"memory: kljax step XLA temp {gib(m['kljax_step_xla_bytes'].get('temp'))}; peak RSS kljax "
          f"{gib(m['kljax_peak_rss_mb'], 1024)}, transformers {gib(m['peer_peak_rss_mb'], 1024)}", flush=True)
