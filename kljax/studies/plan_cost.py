"""Per-device FLOPs and HBM bytes of a whole step, from compiled programs' cost analysis.

XLA's `cost_analysis()` counts a loop's body once (measured: a 10-layer `lax.scan` reports one
layer's FLOPs, on XLA:CPU and the TPU compiler alike), and the run's programs are loops: layers
(scanned), micro-batches (a scan) and the decode steps (while loops of unknown trip count). So
the costs are measured on small versions of the same programs, compiled on the same mesh with
the same shapes, and scaled:
* train, score: one micro-batch (B G / M sequences) with 1 and 2 unrolled layers -> L layers
  (`roofline.extrapolate_layers`), times M micro-batches (the optimizer's update counted M times);
* sample: per chunk of prompts, the prefill (1 and 2 layers) plus each decode segment's steps
  times one decode step (`plain_decode_step`) at that segment's cache width (linear in the width,
  measured at the first and last widths), times the number of chunks. Every row decodes all
  N tokens (no early stop) and the draw from the logits (top-k/p sorting) is left out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kljax import sampling
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as shd
from kljax.sampling.chunks import num_chunks
from kljax.sampling.step import BATCH_AXES, plain_decode_step, prefill, segment_plan
from kljax.studies.plan_programs import RunArrays, abstract_batch, abstract_run, lower_score, lower_train
from kljax.studies.roofline import Cost, compiled_cost, extrapolate_layers


def _small(model: ModelConfig, layers: int) -> ModelConfig:
    return dataclasses.replace(model, num_layers=layers, scan_layers=False, kernels="plain")


def _cost(lowered: Any) -> Cost:
    return compiled_cost(lowered.compile())


def _prefill_cost(run: RunArrays, prompts: int, prompt_len: int) -> Cost:
    rows_sh = shd.data_sharding(run.mesh, 2)
    tokens = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32, sharding=rows_sh)
    mask = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.bool_, sharding=rows_sh)
    model, combine = run.model, run.policy_params

    def fn(trained: Any, base: Any, tokens_bp: jax.Array, mask_bp: jax.Array) -> Any:
        return prefill(combine(base, trained), tokens_bp, mask_bp, tfm.positions_from_mask(mask_bp), config=model)

    with jax.set_mesh(run.mesh):
        return _cost(jax.jit(fn).lower(run.params, run.frozen, tokens, mask))


def _rows_on(x: Any, mesh: Mesh, axis: int) -> jax.ShapeDtypeStruct:
    """x's shape and dtype with axis `axis` (the rows) sharded over the mesh's data axes."""
    spec = [None] * len(x.shape)
    spec[axis] = BATCH_AXES
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))


def _decode_step_cost(run: RunArrays, rows: int, width: int) -> Cost:
    """One decode step for `rows` rows over a cache of `width` slots (updated in place)."""
    model, combine, mesh = run.model, run.policy_params, run.mesh
    shapes = jax.eval_shape(lambda: tfm.init_cache(model, rows, width))
    cache = tfm.KVCache(_rows_on(shapes.k, mesh, 1), _rows_on(shapes.v, mesh, 1), _rows_on(shapes.mask, mesh, 0))
    tokens = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=shd.data_sharding(mesh, 1))

    def fn(trained: Any, base: Any, cache: Any, tokens_r: jax.Array, positions_r: jax.Array) -> Any:
        return plain_decode_step(combine(base, trained), tokens_r, positions_r, cache, width - 1, model)

    with jax.set_mesh(mesh):
        return _cost(jax.jit(fn, donate_argnums=2).lower(run.params, run.frozen, cache, tokens, tokens))


def _sample_cost(model: ModelConfig, settings: Any, mesh: Mesh, prompt_len: int) -> Cost:
    rl = settings.rl
    chunks = num_chunks(rl.prompts_per_step, rl.sampler_chunk)
    prompts = rl.prompts_per_step // chunks
    rows = prompts * rl.group_size
    runs = [abstract_run(_small(model, k), settings, mesh) for k in (1, 2)]
    total = extrapolate_layers(*(_prefill_cost(r, prompts, prompt_len) for r in runs), model.num_layers)
    segments = segment_plan(prompt_len, rl.max_new_tokens)
    if segments:
        w1, w2 = segments[0][2], segments[-1][2]
        one, two = (_decode_step_cost(r, rows, w1) for r in runs)
        layer_w1, head = two - one, one - (two - one)
        slope = (_decode_step_cost(runs[1], rows, w2) - two).scale(1 / (2 * (w2 - w1))) if w2 > w1 else Cost()
        for start, end, width in segments:
            per_layer = layer_w1 + slope.scale(width - w1)
            total = total + (head + per_layer.scale(model.num_layers)).scale(end - start)
    return total.scale(chunks)


def step_costs(model: ModelConfig, settings: Any, mesh: Mesh, programs: tuple[str, ...]) -> tuple[dict[str, Cost],
                                                                                                   float]:
    """({phase: per-device Cost of one whole step's program}, seconds spent compiling) for the run's
    `programs` (train, sample, score) on `mesh`."""
    t0 = time.perf_counter()
    rl = settings.rl
    prompt_len = sampling.bucket_length(rl.max_prompt_len)
    m = rl.micro_batches
    rows = rl.prompts_per_step * rl.group_size // m
    costs: dict[str, Cost] = {}
    if "train" in programs or "score" in programs:
        runs = [abstract_run(_small(model, k), settings, mesh) for k in (1, 2)]
        batch = abstract_batch(mesh, rows, prompt_len, rl.max_new_tokens)
        if "train" in programs:
            one, two = (_cost(lower_train(r, settings, batch, 1)) for r in runs)
            costs["train"] = extrapolate_layers(one, two, model.num_layers).scale(m)
        if "score" in programs:
            one, two = (_cost(lower_score(r, batch, 1)) for r in runs)
            costs["score"] = extrapolate_layers(one, two, model.num_layers).scale(m)
    if "sample" in programs:
        costs["sample"] = _sample_cost(model, settings, mesh, prompt_len)
    return costs, time.perf_counter() - t0
