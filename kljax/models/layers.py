"""The transformer's building blocks, each a plain-JAX function or its XLA-CPU kernel.

`config.cpu_kernels` (`model.kernels`: "plain", "cpu", or "auto" = cpu on a CPU backend only)
picks one; the plain path is the readable reference and the TPU/GPU path:
  project    x . w over x's last n_in axes (`jnp.tensordot`, float32 accumulation)
  attention  `jax.nn.dot_product_attention` (XLA's fused attention on TPU, cuDNN where it applies)
  rms_norm   x / rms(x) * w, statistics in float32, autodiff backward
  rope_cs    cos and sin of the rotary angles
The cpu kernels (`kljax.kernels.cpu`) compute the same values with hand-written backwards and
memory layouts; tests/test_kernels.py checks each against its plain twin in value and gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kljax.kernels.cpu import attention as cpu_attention
from kljax.kernels.cpu import matmul as cpu_matmul
from kljax.kernels.cpu import rms_norm as cpu_rms_norm
from kljax.models.config import ModelConfig


def project(x: jax.Array, w: jax.Array, n_in: int, config: ModelConfig) -> jax.Array:
    """x [..., in...] . w [in..., out...] -> [..., out...], accumulated in float32, in x.dtype."""
    if config.cpu_kernels:
        return cpu_matmul.project(x, w, n_in)
    return jnp.tensordot(x, w, axes=n_in, preferred_element_type=jnp.float32).astype(x.dtype)


def attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array, allowed_bts: jax.Array,
              config: ModelConfig) -> jax.Array:
    """Grouped-query attention: q [B, T, H, Dh], k / v [B, S, Kv, Dh], allowed [B, T, S] bool ->
    [B, T, H, Dh] in q's dtype; scores scaled by Dh^-1/2 in float32. A fully masked row (padding)
    gives a finite output."""
    if config.cpu_kernels:
        return cpu_attention.attention(q_bthk, k_bsgk, v_bsgk, allowed_bts)
    return jax.nn.dot_product_attention(q_bthk, k_bsgk.astype(q_bthk.dtype), v_bsgk.astype(q_bthk.dtype),
                                        mask=allowed_bts[:, None])


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, config: ModelConfig) -> jax.Array:
    """RMSNorm over the last axis: statistics in float32, result in x.dtype, times weight [D]."""
    if config.cpu_kernels:
        return cpu_rms_norm.rms_norm(x, weight, eps)
    x32 = x.astype(jnp.float32)
    xn = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    return weight.astype(x.dtype) * xn


def rope_cs(angles: jax.Array, config: ModelConfig) -> jax.Array:
    """[cos, sin] of the rotary angles, stacked on a new leading axis (float32)."""
    cs = jnp.stack([jnp.cos(angles), jnp.sin(angles)])
    return cpu_rms_norm.materialized(cs) if config.cpu_kernels else cs
