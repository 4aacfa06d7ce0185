"""The sampler's model calls: prefill (the model's own forward) and the decode step.

Prefill runs `kljax.models.transformer.forward_hidden` over the left-padded prompts with a cache of exactly
P slots and keeps the last position's logits. Under `model.kernels` plain (the TPU/GPU path) each decode
step is that forward for one token per row (`plain_decode_step`). With the XLA-CPU kernels, decoding uses a
layout for one token per row and step, prepared once per `generate` call (why each: docs/performance.md):
* feature-major activations x [D, R]: every projection is W^T [out, in] @ x [in, R], the tied unembedding
  the embedding [V, D] itself; `decode_weights` holds one transposed entry per layer (a loop would copy each
  dynamic slice of a stacked weight every step), with q/k/v fused into [(H + 2 Kv) Dh, D] and gate/up into
  [2F, D] in unsharded runs;
* `DecodeCache`: per layer k [R, Kv, Dh, W], v [R, Kv, W, Dh] and a mask [R, W]; scores are a multiply-reduce
  over Dh in float32 and a batched [G, Dh] x [Dh, W] dot per (row, kv head) in 16 bits; W grows by segments
  (a few `lax.while_loop`s, segment s attending over the W_s slots it can have filled);
* in 16 bits, cache updates go through the uint16 bits and the output projection runs row-major.
Same maths as `decoder_layer.decoder_layer` at T = 1; tests/test_sampling*.py and tests/test_kernels.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kljax.models.config import ModelConfig
from kljax.models.lora import merge
from kljax.models.transformer import (
    KVCache,
    Params,
    forward_hidden,
    init_cache,
    logits_from_hidden,
    rope_inv_freq,
)

_NEG = -1e30  # as in the model: fully masked rows stay finite
MIN_SEGMENT_STEPS = 32  # a segment shorter than this is not worth its extra compiled loop body
MAX_SEGMENTS = 4
FUSE_WEIGHTS = True  # fuse q/k/v and gate/up in unsharded runs (see `decode_weights`)
BATCH_AXES = ("data", "fsdp")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeCache:
    """Per-layer key/value buffers for decoding, in `config.dtype`.

    k: tuple of L arrays [R, Kv, Dh, W] (keys after RoPE, transposed); v: tuple of L arrays
    [R, Kv, W, Dh]; mask_rw: bool [R, W], True where a slot holds a token.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask_rw: jax.Array

    @property
    def width(self) -> int:
        return self.mask_rw.shape[1]


def constrain_batch(x: jax.Array, mesh: Mesh | None, axis: int = 0) -> jax.Array:
    """Shard axis `axis` (the rows) over the mesh's data axes; the others replicated."""
    if mesh is None:
        return x
    spec = [None] * x.ndim
    spec[axis] = BATCH_AXES
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))


def constrain_cache(cache: DecodeCache | KVCache, mesh: Mesh | None) -> DecodeCache | KVCache:
    if isinstance(cache, KVCache):  # [L, R, W, Kv, Dh]: rows on axis 1
        return KVCache(constrain_batch(cache.k, mesh, 1), constrain_batch(cache.v, mesh, 1),
                       constrain_batch(cache.mask, mesh))
    return jax.tree.map(lambda a: constrain_batch(a, mesh), cache)


def cache_bytes(config: ModelConfig, rows: int, width: int) -> int:
    """Bytes of a DecodeCache of `rows` x `width` slots."""
    kv = 2 * config.num_layers * rows * config.num_kv_heads * width * config.head_dim
    return kv * config.jnp_dtype.itemsize + rows * width


# ---------------------------------------------------------------------------------------- prefill


def prefill(
    params: Params,
    tokens_bp: jax.Array,
    mask_bp: jax.Array,
    positions_bp: jax.Array,
    *,
    config: ModelConfig,
) -> tuple[jax.Array, DecodeCache]:
    """Run the left-padded prompts [B, P]: float32 logits [B, V] of the last slot and a cache of
    width P: a `DecodeCache` for the CPU decode layout, the model's `KVCache` under plain kernels."""
    b, p = tokens_bp.shape
    cache = init_cache(config, b, p)
    hidden_bpd, cache = forward_hidden(params, tokens_bp, mask_bp, positions_bp, config, cache, 0)
    logits_bv = logits_from_hidden(params, hidden_bpd[:, -1], config)
    if not config.cpu_kernels:
        return logits_bv, cache
    # model layout [L, B, P, Kv, Dh] -> per layer k [B, Kv, Dh, P], v [B, Kv, P, Dh]
    keys = tuple(jnp.transpose(cache.k[i], (0, 2, 3, 1)) for i in range(config.num_layers))
    values = tuple(jnp.transpose(cache.v[i], (0, 2, 1, 3)) for i in range(config.num_layers))
    return logits_bv, DecodeCache(keys, values, cache.mask)


def repeat_rows(cache: DecodeCache | KVCache, n: int) -> DecodeCache | KVCache:
    """Each row n times in a row (row r -> rows r*n ... r*n + n - 1)."""
    if n == 1:
        return cache
    if isinstance(cache, KVCache):
        return KVCache(jnp.repeat(cache.k, n, axis=1), jnp.repeat(cache.v, n, axis=1), jnp.repeat(cache.mask, n, 0))
    return jax.tree.map(lambda a: jnp.repeat(a, n, axis=0), cache)


def widen(cache: DecodeCache | KVCache, width: int) -> DecodeCache | KVCache:
    """Pad the slot axis with empty slots up to `width`."""
    if isinstance(cache, KVCache):
        extra = width - cache.mask.shape[1]
        if extra <= 0:
            return cache
        pad = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, extra), (0, 0), (0, 0)))
        return KVCache(pad(cache.k), pad(cache.v), jnp.pad(cache.mask, ((0, 0), (0, extra))))
    extra = width - cache.width
    if extra <= 0:
        return cache
    pad_k = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, extra)))
    pad_v = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, extra), (0, 0)))
    return DecodeCache(
        tuple(pad_k(a) for a in cache.k), tuple(pad_v(a) for a in cache.v),
        jnp.pad(cache.mask_rw, ((0, 0), (0, extra))),
    )


# ---------------------------------------------------------------------------------------- weights


def decode_weights(params: Params, config: ModelConfig, *, fuse: bool = True) -> dict[str, Any]:
    """Per-layer transposed weights [out, in] in `config.dtype` for the decode step.

    `fuse` concatenates q/k/v and gate/up into one matrix each (fewer, larger dots); sharded runs
    keep them apart so no sharded weight is re-laid out. Costs one copy of the weights while
    sampling (the tied unembedding excepted).
    """
    dt = config.jnp_dtype
    d, h, dh = config.hidden_size, config.num_heads, config.head_dim
    t = lambda a, rows: a.reshape(rows, -1).T.astype(dt)  # [in..., out...] -> [out, in]
    layers = []
    for i in range(config.num_layers):
        lp = {name: a[i] for name, a in params["layers"].items()}
        w = {
            "attn_norm": lp["attn_norm"],
            "mlp_norm": lp["mlp_norm"],
            # float32: [D, H Dh] like the others; 16-bit: [H Dh, D], used row-major (see _decode_layer)
            "o": t(lp["o"], h * dh) if dt.itemsize == 4 else lp["o"].reshape(h * dh, d).astype(dt),
            "down": t(lp["down"], config.intermediate_size),
        }
        q, k, v = t(lp["q"], d), t(lp["k"], d), t(lp["v"], d)
        if fuse:
            w["qkv"] = jnp.concatenate([q, k, v], axis=0)
            w["gate_up"] = jnp.concatenate([t(lp["gate"], d), t(lp["up"], d)], axis=0)
        else:
            w.update(q=q, k=k, v=v, gate=t(lp["gate"], d), up=t(lp["up"], d))
        if config.qkv_bias:
            w["qkv_bias"] = jnp.concatenate(
                [lp["q_bias"].reshape(-1), lp["k_bias"].reshape(-1), lp["v_bias"].reshape(-1)]
            ).astype(dt)
        if config.o_bias:
            w["o_bias"] = lp["o_bias"].astype(dt)
        if config.qk_norm:
            w["q_norm"], w["k_norm"] = lp["q_norm"], lp["k_norm"]
        layers.append(w)
    head_vd = params["embed"] if config.tie_embeddings else params["lm_head"].T
    return {
        "embed": params["embed"],
        "final_norm": params["final_norm"],
        "head_vd": head_vd.astype(dt),
        "layers": layers,
    }


# ---------------------------------------------------------------------------------------- step


def weight_matmul(w: jax.Array, x: jax.Array) -> jax.Array:
    """w @ x accumulated in float32, returned in x.dtype. Asking for a float32 result is what makes
    XLA CPU use its bfloat16 kernels; a bf16-out dot is upcast to a float32 dot, weights included."""
    return jnp.dot(w, x, preferred_element_type=jnp.float32).astype(x.dtype)


def _write_slot(cache: jax.Array, update: jax.Array, start: tuple) -> jax.Array:
    """dynamic_update_slice; 16-bit floats go through their bits, or XLA CPU turns the update into a
    float32 round trip over the whole buffer."""
    if cache.dtype.itemsize != 2:
        return jax.lax.dynamic_update_slice(cache, update.astype(cache.dtype), start)
    bits = jax.lax.dynamic_update_slice(
        jax.lax.bitcast_convert_type(cache, jnp.uint16),
        jax.lax.bitcast_convert_type(update.astype(cache.dtype), jnp.uint16), start,
    )
    return jax.lax.bitcast_convert_type(bits, cache.dtype)


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float, axis: int) -> jax.Array:
    """`transformer.rms_norm` over `axis` (statistics in float32, result in x.dtype, times weight)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + eps)
    shape = [1] * x.ndim
    shape[axis] = -1
    return weight.astype(x.dtype).reshape(shape) * x32.astype(x.dtype)


def _rope(x_hkr: jax.Array, cos_1kr: jax.Array, sin_1kr: jax.Array) -> jax.Array:
    """Rotate halves of the head dim (axis 1; HF `rotate_half`), in float32 as the model does."""
    x1, x2 = jnp.split(x_hkr.astype(jnp.float32), 2, axis=1)
    return jnp.concatenate([x1 * cos_1kr - x2 * sin_1kr, x2 * cos_1kr + x1 * sin_1kr], axis=1).astype(x_hkr.dtype)


def _decode_layer(
    x_dr: jax.Array,
    w: dict[str, jax.Array],
    rope: tuple[jax.Array, jax.Array],
    k_cache: jax.Array,
    v_cache: jax.Array,
    allowed_rw: jax.Array,
    slot: jax.Array,
    config: ModelConfig,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One block for one new token per row: x [D, R] -> x [D, R], with its k/v written at `slot`."""
    r = x_dr.shape[1]
    h, kv, dh, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
    normed = _rms_norm(x_dr, w["attn_norm"], eps, axis=0)
    if "qkv" in w:
        qkv = weight_matmul(w["qkv"], normed)
    else:
        qkv = jnp.concatenate([weight_matmul(w[n], normed) for n in ("q", "k", "v")], axis=0)
    if config.qkv_bias:
        qkv = qkv + w["qkv_bias"][:, None]
    q = qkv[: h * dh].reshape(h, dh, r)
    k = qkv[h * dh: (h + kv) * dh].reshape(kv, dh, r)
    v = qkv[(h + kv) * dh:].reshape(kv, dh, r)
    if config.qk_norm:
        q, k = _rms_norm(q, w["q_norm"], eps, axis=1), _rms_norm(k, w["k_norm"], eps, axis=1)
    q, k = _rope(q, *rope), _rope(k, *rope)
    k_rkd = jnp.transpose(k, (2, 0, 1))  # row-major for the cache and attention
    v_rkd = jnp.transpose(v, (2, 0, 1))
    k_cache = _write_slot(k_cache, k_rkd[..., None], (0, 0, 0, slot))
    v_cache = _write_slot(v_cache, v_rkd[:, :, None, :], (0, 0, slot, 0))
    if x_dr.dtype.itemsize == 2:  # [G, Dh] x [Dh, W] per (row, kv head), bf16 kernels
        q = jnp.transpose(q, (2, 0, 1)).reshape(r, kv, h // kv, dh)
        scores = jnp.einsum("rkgd,rkdw->rkgw", q, k_cache, preferred_element_type=jnp.float32)
    else:  # the same as a multiply-reduce over Dh, W contiguous
        q = jnp.transpose(q, (2, 0, 1)).reshape(r, kv, h // kv, dh, 1).astype(jnp.float32)
        scores = jnp.sum(q * k_cache[:, :, None].astype(jnp.float32), axis=-2)  # [R, Kv, G, W]
    scores = jnp.where(allowed_rw[:, None, None, :], scores * (dh**-0.5), _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(x_dr.dtype)
    attn = jnp.einsum("rkgw,rkwd->rkgd", probs, v_cache.astype(x_dr.dtype), preferred_element_type=jnp.float32)
    attn_rj = attn.astype(x_dr.dtype).reshape(r, h * dh)
    if x_dr.dtype.itemsize == 2:
        # Row-major [R, H Dh] @ [H Dh, D]: with the transposed attention operand a 16-bit dot
        # falls back to float32 on XLA CPU, converting the weight every step.
        x_dr = x_dr + jnp.dot(attn_rj, w["o"], preferred_element_type=jnp.float32).astype(x_dr.dtype).T
    else:
        x_dr = x_dr + weight_matmul(w["o"], attn_rj.T)
    if config.o_bias:
        x_dr = x_dr + w["o_bias"][:, None]
    normed = _rms_norm(x_dr, w["mlp_norm"], eps, axis=0)
    if "gate_up" in w:
        gate, up = jnp.split(weight_matmul(w["gate_up"], normed), 2, axis=0)
    else:
        gate, up = weight_matmul(w["gate"], normed), weight_matmul(w["up"], normed)
    return x_dr + weight_matmul(w["down"], jax.nn.silu(gate) * up), k_cache, v_cache


def decode_step(
    weights: dict[str, Any],
    tokens_r: jax.Array,
    positions_r: jax.Array,
    cache: DecodeCache,
    slot: jax.Array,
    config: ModelConfig,
) -> tuple[jax.Array, DecodeCache]:
    """Feed one token per row at RoPE position `positions_r`, into cache slot `slot`.

    Returns float32 logits [R, V] for the next token and the updated cache.
    """
    x_dr = weights["embed"].astype(config.jnp_dtype)[tokens_r].T
    angles = jnp.asarray(rope_inv_freq(config))[None, :, None] * positions_r.astype(jnp.float32)
    rope = (jnp.cos(angles), jnp.sin(angles))  # [1, Dh/2, R]
    mask_rw = jax.lax.dynamic_update_slice(cache.mask_rw, jnp.ones((tokens_r.shape[0], 1), bool), (0, slot))
    ks, vs = [], []
    for i, w in enumerate(weights["layers"]):
        x_dr, k, v = _decode_layer(x_dr, w, rope, cache.k[i], cache.v[i], mask_rw, slot, config)
        ks.append(k)
        vs.append(v)
    x_dr = _rms_norm(x_dr, weights["final_norm"], config.rms_norm_eps, axis=0)
    logits_vr = jnp.dot(weights["head_vd"], x_dr, preferred_element_type=jnp.float32)
    # The barrier keeps XLA from folding the transpose into the dot's output layout: a plain [V, R]
    # dot is twice as fast on CPU, and the folded bf16 x bf16 -> f32 form has no CPU kernel at all.
    return jax.lax.optimization_barrier(logits_vr).T, DecodeCache(tuple(ks), tuple(vs), mask_rw)


def plain_decode_step(
    params: Params, tokens_r: jax.Array, positions_r: jax.Array, cache: KVCache, slot: jax.Array,
    config: ModelConfig,
) -> tuple[jax.Array, KVCache]:
    """`decode_step` under plain kernels: the model's own forward for one token per row, written
    into cache slot `slot`. Float32 logits [R, V] and the updated cache."""
    r = tokens_r.shape[0]
    hidden, cache = forward_hidden(params, tokens_r[:, None], jnp.ones((r, 1), bool), positions_r[:, None], config,
                                   cache, slot)
    return logits_from_hidden(params, hidden[:, 0], config), cache


def step_weights(params: Params, config: ModelConfig, mesh: Mesh | None) -> Any:
    """What the decode step reads: `decode_weights` for the CPU layout, the params themselves otherwise.

    LoRA adapters (`kljax.models.lora`) are merged into the CPU layout's weights, which are a copy
    anyway (no extra memory, no adapter matmuls per token); under plain kernels the model's own
    forward applies them unmerged, so the decode holds no second copy of the base."""
    if not config.cpu_kernels:
        return params
    if config.lora is not None:
        params = merge(params, config)
    return decode_weights(params, config, fuse=mesh is None and FUSE_WEIGHTS)


# ---------------------------------------------------------------------------------------- loop


def segment_plan(prompt_len: int, max_new_tokens: int, num_segments: int | None = None) -> list[tuple[int, int, int]]:
    """(first step, end step, cache width) for each decode segment.

    Step i (1 <= i < N) feeds token i - 1 into slot P + i - 1 and samples token i, so it needs
    P + i slots; a segment [a, b) needs width P + b - 1. Default: up to MAX_SEGMENTS segments of at
    least MIN_SEGMENT_STEPS steps.
    """
    steps = max_new_tokens - 1
    if steps <= 0:
        return []
    if num_segments is None:
        num_segments = max(1, min(MAX_SEGMENTS, steps // MIN_SEGMENT_STEPS))
    num_segments = max(1, min(num_segments, steps))
    bounds = np.linspace(1, max_new_tokens, num_segments + 1).round().astype(int)
    return [(int(a), int(b), prompt_len + int(b) - 1) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def decode_loop(
    weights: dict[str, Any],
    state: Any,
    step_fn: Callable[[Any, jax.Array, DecodeCache], Any],
    *,
    prompt_len: int,
    config: ModelConfig,
    max_new_tokens: int,
    mesh: Mesh | None = None,
    num_segments: int | None = None,
) -> Any:
    """Run the decode `lax.while_loop`s over `state` (a dataclass with `step`, `tokens_rn`,
    `positions_r`, `done_r` and `cache`, from `prefill`); `step_fn(state, logits_rv, cache)` samples
    and returns the next state. Stops when every row is done or N tokens are sampled. `weights`:
    `step_weights`."""
    for _, end, width in segment_plan(prompt_len, max_new_tokens, num_segments):
        state = dataclasses.replace(state, cache=constrain_cache(widen(state.cache, width), mesh))

        def cond(state, end=end):
            return (state.step < end) & ~jnp.all(state.done_r)

        def body(state):
            last_r = jax.lax.dynamic_index_in_dim(state.tokens_rn, state.step - 1, 1, keepdims=False)
            step = decode_step if config.cpu_kernels else plain_decode_step
            logits_rv, cache = step(weights, last_r, state.positions_r, state.cache, prompt_len + state.step - 1,
                                    config)
            return step_fn(state, constrain_batch(logits_rv, mesh), constrain_cache(cache, mesh))

        state = jax.lax.while_loop(cond, body, state)
    return state
