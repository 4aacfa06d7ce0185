"""The kljax side of `kljax bench rl` (run in its own process): the real trainer (`run_build.build`,
then `trainer.iteration`, the loop body of `kljax train`) configured to match TRL's side, timed per
iteration with its sample / reward / score / update split and its XLA compile time apart.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import common
from benchmarks.rl import BETA, CLIP, LEARNING_RATE, SPLIT, TASK, iteration_prompts, progress, side_result


def kljax_config(settings: dict[str, Any], prompt_format: str, max_prompt_len: int) -> Any:
    """The run config of kljax's side: the default run with the benchmark's matched settings."""
    from kljax.config.load import load_run_config

    fields: dict[str, Any] = {
        "seed": settings["seed"],
        "model": {"source": settings["model_dir"], "remat": "full" if settings["gradient_checkpointing"] else "none",
                  "dtype": settings["dtype"], "param_dtype": "float32", "scan_layers": settings["scan_layers"]},
        # answer_line as `iteration_prompts`, so both sides get the same prompt texts
        "task": {"name": TASK, "split": SPLIT, "prompt_format": prompt_format, "answer_format": "answer_line"},
        "kl": {"estimator": "k3", "placement": "loss", "beta": BETA},
        "rl": {"advantage": "grpo", "group_size": settings["group"], "prompts_per_step": settings["prompts"],
               "max_prompt_len": max_prompt_len, "max_new_tokens": settings["new_tokens"],
               "temperature": settings["temperature"], "top_p": 1.0, "top_k": 0,
               "loss_aggregation": "seq-mean-token-mean", "clip_low": CLIP, "clip_high": None, "updates_per_batch": 1,
               "async_level": 0, "micro_batches": settings["micro_batches"]},
        "optim": {"learning_rate": LEARNING_RATE, "schedule": "constant", "max_grad_norm": 1.0},
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
    }
    if settings.get("lora_rank"):  # adapters only; the base is frozen and is the reference
        fields["model"]["lora"] = {"rank": settings["lora_rank"], "alpha": float(settings["lora_alpha"]),
                                   "targets": ",".join(settings["lora_targets"])}
    return load_run_config(fields)


def kljax_side(settings: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_compilation_cache", False)  # report cold compile times
    from transformers import AutoTokenizer

    from kljax.train.run_build import build
    from kljax.train.trainer import host_memory_mb
    from kljax.train.trainer import iteration as trainer_iteration

    compiles = common.CompileTimer()
    t_setup = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    _, fmt, examples, texts = iteration_prompts(settings, tokenizer)  # run.task renders the texts the same way
    longest = max(len(tokenizer.encode(t, add_special_tokens=False)) for step in texts for t in step)
    rs = kljax_config(settings, fmt, longest)
    run, state, ref_params = build(rs)
    jax.block_until_ready((state, ref_params))
    setup_s = time.perf_counter() - t_setup
    rss_setup = common.peak_rss_mb()
    m = run.policy.model
    # the model's parameters (with LoRA the state holds only the adapters; the base is ref_params)
    params = common.body_and_head_params(sum(x.size for x in jax.tree.leaves(ref_params)), m.vocab_size,
                                         m.hidden_size, m.tie_embeddings)

    beta = float(rs.kl.beta)

    def iteration(state: Any, step: int) -> tuple[Any, dict[str, float], dict[str, float]]:
        """`trainer.iteration` (the loop body of `kljax train`) on the prompts the peer also gets, timed."""
        nonlocal beta
        t0, c0 = time.perf_counter(), time.process_time()
        it = trainer_iteration(run, state, ref_params, step, beta=beta, examples=examples[step])
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        beta, row, batch = it.beta, it.row, it.batch
        split = {"sample": row["time_sample"], "reward": row["time_reward"], "score": row["time_score"],
                 "update": row["time_update"], "total": total, "cpu": cpu}
        seq, gen = float(jnp.sum(batch.mask_bs)), float(jnp.sum(batch.response_mask_br))
        tokens = {"prompt_unique": (seq - gen) / rs.rl.group_size, "generated": gen, "sequence": seq,
                  "completions": int(batch.tokens_bs.shape[0])}
        progress("kljax", step + 1, settings["iterations"], total,
                 {k: split[k] for k in ("sample", "reward", "score", "update")})
        return it.state, split, tokens

    mark = compiles.mark()
    state, first, _ = iteration(state, 0)
    compile_s = compiles.since(mark)
    rss_first = common.peak_rss_mb()
    for i in range(settings["warmup"]):
        state, _, _ = iteration(state, 1 + i)
    mark = compiles.mark()
    splits, tokens = [], []
    for i in range(settings["repeats"]):
        state, split, tok = iteration(state, 1 + settings["warmup"] + i)
        splits.append(split)
        tokens.append(tok)
    compiled_while_timed = compiles.since(mark)
    peak = common.peak_gflops(settings["peak_gflops"], settings["dtype"])
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    return side_result(splits, tokens, params, settings, int(state.step), extra={
        "compile_s": round(compile_s, 3), "first_iteration_s": round(first["total"], 3),
        "compile_s_while_timed": round(compiled_while_timed, 3), "setup_s": round(setup_s, 3), "peak": peak,
        "rss_after_setup_mb": rss_setup, "rss_after_first_iteration_mb": rss_first,
        "rss_resident_at_end_mb": host_memory_mb(), "prompt_format": fmt, "max_prompt_len": longest,
        "compute_dtype": str(m.dtype), "param_dtype": str(jax.tree.leaves(state.params)[0].dtype),
        "scan_layers": bool(m.scan_layers),
        "trained_params": sum(x.size for x in jax.tree.leaves(state.params)),
        "device": getattr(device, "device_kind", device.platform),
        "peak_device_mb": stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None,
        "versions": common.versions(),
    })
