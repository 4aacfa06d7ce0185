"""One decoder layer of the transformer, and what it needs: RoPE tables and the stacked KV cache.

`decoder_layer` is the block `kljax.models.transformer.forward_hidden` scans over (and the
micro-batched update of `layer_stack` calls); the sampler's plain decode step runs it for one token.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models import lora
from kljax.models.config import ModelConfig
from kljax.models.layers import attention, rms_norm, rope_cs

Params = Any


# ---------------------------------------------------------------------------------------- cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Stacked per-layer key/value buffers; the contract is `transformer.apply_with_cache`'s.

    k, v: [L, B, S, Kv, Dh] (keys after RoPE); mask: bool [B, S], True where a slot holds a token.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype: Any = None) -> KVCache:
    """An empty cache of `max_len` slots in `dtype` (default `config.dtype`)."""
    shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
    dtype = dtype or config.jnp_dtype
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch_size, max_len), bool))


# ---------------------------------------------------------------------------------------- blocks


def positions_from_mask(mask_bt: jax.Array) -> jax.Array:
    """RoPE positions [B, T] for a (left-)padded batch: 0, 1, ... over the valid tokens of each row."""
    return jnp.maximum(jnp.cumsum(mask_bt.astype(jnp.int32), axis=-1) - 1, 0)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies [Dh // 2] float32, with the linear or Llama-3 frequency scaling."""
    dh = config.head_dim
    inv = (1.0 / (config.rope_theta ** (np.arange(0, dh, 2, dtype=np.float32) / dh))).astype(np.float32)
    if config.rope_type == "linear":
        return (inv / config.rope_factor).astype(np.float32)
    if config.rope_type == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        low_wavelen = config.rope_original_max_positions / config.rope_low_freq_factor
        high_wavelen = config.rope_original_max_positions / config.rope_high_freq_factor
        wavelen = 2 * np.pi / inv
        smooth = (config.rope_original_max_positions / wavelen - config.rope_low_freq_factor) / (
            config.rope_high_freq_factor - config.rope_low_freq_factor
        )
        mid = (1 - smooth) * inv / config.rope_factor + smooth * inv
        kept = np.where(wavelen < high_wavelen, inv, mid)
        inv = np.where(wavelen > low_wavelen, inv / config.rope_factor, kept)
        return inv.astype(np.float32)
    return inv


def rope_tables(positions_bt: jax.Array, config: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, 1, Dh // 2] float32."""
    angles = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
    cs = rope_cs(angles, config)
    return cs[0][:, :, None, :], cs[1][:, :, None, :]


def apply_rope(x_bthk: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate the two halves of the head dimension (the HF `rotate_half` convention)."""
    x1, x2 = jnp.split(x_bthk.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_bthk.dtype)


def decoder_layer(
    x_btd: jax.Array,
    lp: Params,
    rope: tuple[jax.Array, jax.Array],
    allowed_bts: jax.Array,
    cache_kv: tuple[jax.Array, jax.Array] | None,
    layer_index: jax.Array | int,
    cache_index: jax.Array | None,
    config: ModelConfig,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """One pre-norm block: x + attn(norm(x)), then + SwiGLU(norm(x)). Updates the stacked cache."""
    dt, eps = x_btd.dtype, config.rms_norm_eps
    w = lambda name: lp[name].astype(dt)
    proj = lambda x, name, n_in=1: lora.project(x, lp, name, n_in, config)  # + its adapter, where lp has one
    h = rms_norm(x_btd, lp["attn_norm"], eps, config)
    q, k, v = proj(h, "q"), proj(h, "k"), proj(h, "v")
    if config.qkv_bias:
        q, k, v = q + w("q_bias"), k + w("k_bias"), v + w("v_bias")
    if config.qk_norm:
        q, k = rms_norm(q, lp["q_norm"], eps, config), rms_norm(k, lp["k_norm"], eps, config)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if cache_kv is not None:
        ck, cv = cache_kv
        start = (layer_index, 0, cache_index, 0, 0)
        ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), start)
        cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), start)
        keys = jax.lax.dynamic_index_in_dim(ck, layer_index, 0, keepdims=False).astype(dt)
        values = jax.lax.dynamic_index_in_dim(cv, layer_index, 0, keepdims=False).astype(dt)
        cache_kv = (ck, cv)
    else:
        keys, values = k, v
    attn = attention(q, keys, values, allowed_bts, config)
    x_btd = x_btd + proj(attn, "o", 2)
    if config.o_bias:
        x_btd = x_btd + w("o_bias")
    h = rms_norm(x_btd, lp["mlp_norm"], eps, config)
    gated = jax.nn.silu(proj(h, "gate")) * proj(h, "up")
    return x_btd + proj(gated, "down"), cache_kv
