"""XLA-CPU RMSNorm, whose weight gradient is summed over the rows as a float32 product (and the
RoPE tables' materialization, `materialized`).

    r = 1 / sqrt(mean_d x_d^2 + eps),   xn = x r   (float32, rounded to x.dtype),   y = w xn

    dL/dw_d = sum_n g_nd xn_nd      (float32, over every row n: one (1 x N) @ (N x D) product)

and dL/dx by autodiff of the rest. Why: autodiff's bfloat16-typed row sum becomes a slow tree of
reduce-windows on XLA CPU (docs/performance.md). Only 16-bit x takes the custom product.
`tests/test_rms_norm.py` and tests/test_kernels.py check it against the plain formula.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis: statistics in float32, result in x.dtype, times weight [D]
    (cast to x.dtype)."""
    x32 = x.astype(jnp.float32)
    xn = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    return _scale(xn, weight) if x.dtype.itemsize == 2 else _times(xn, weight)


def _times(xn: jax.Array, weight: jax.Array) -> jax.Array:
    """weight.astype(xn.dtype) * xn, weight [D] over xn [..., D]."""
    return weight.astype(xn.dtype) * xn


@jax.custom_vjp
def _scale(xn: jax.Array, weight: jax.Array) -> jax.Array:
    """`_times` with the float32 row-sum weight gradient of `_scale_bwd`."""
    return _times(xn, weight)


def _scale_fwd(xn: jax.Array, weight: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _scale(xn, weight), (xn, weight)


def _scale_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    xn, weight = res
    d = xn.shape[-1]
    prod_nd = (g.astype(jnp.float32) * xn.astype(jnp.float32)).reshape(-1, d)
    dw = jnp.dot(jnp.ones((1, prod_nd.shape[0]), jnp.float32), prod_nd)[0]
    return g * weight.astype(xn.dtype), dw.astype(weight.dtype)


_scale.defvjp(_scale_fwd, _scale_bwd)


def materialized(x: jax.Array) -> jax.Array:
    """x, held in memory: an identity reduce_precision (float32 to float32) is what XLA CPU will not
    fuse into the consumers. Used for RoPE's cos/sin tables, which fused into every rotation of q
    and k were recomputed per element (docs/performance.md; an optimization_barrier does not stop
    that fusion on CPU)."""
    return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=23)
