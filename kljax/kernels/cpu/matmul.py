"""XLA-CPU matmuls: float32 accumulation in the compute dtype, and the weight projections'
hand-written backward with row-major operands (what XLA CPU's matmul kernels need to run fast).

`matmul(x, w)` is the 2-D product with that backward, `project(x, w, n_in)` every weight
projection of `kljax.models.transformer` under `model.kernels="cpu"`, `row_major` the layout
constraint 16-bit dot operands need on CPU. Products accumulate in float32 and return x.dtype:
XLA CPU runs a 16-bit-out dot as a float32 dot, converting both operands first; asking for the
float32 result is what selects its bfloat16 kernels.
`tests/test_matmul_backward.py` and `tests/test_models_shapes.py` check the
gradients against autodiff and the compiled bfloat16 backward's operand types.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint


def row_major(a: jax.Array) -> jax.Array:
    """`a` laid out row-major in memory (16-bit arrays on CPU; otherwise unchanged): XLA CPU runs a
    16-bit dot with a column-major operand as a float32 dot, without its bfloat16 kernels."""
    if jax.default_backend() != "cpu" or a.dtype.itemsize != 2:
        return a
    return with_layout_constraint(a, Layout(major_to_minor=tuple(range(a.ndim))))


@jax.custom_vjp
def matmul(x_ni: jax.Array, w_io: jax.Array) -> jax.Array:
    """x [N, I] @ w [I, O] accumulated in float32, in x.dtype (module doc), with a hand-written
    backward: dx = dy w^T and dw = x^T dy from operands that are materialized first.

    Why: XLA CPU's matmul kernels take row-major operands, so the backward's transposed operands
    are copied, and left to itself XLA fuses the producers of the copied arrays into a slow
    transposing loop (docs/performance.md); the barrier makes each a plain copy."""
    return _product(x_ni, w_io)


def _product(x_ni: jax.Array, w_io: jax.Array) -> jax.Array:
    return jnp.dot(x_ni, w_io, preferred_element_type=jnp.float32).astype(x_ni.dtype)


def _matmul_fwd(x_ni: jax.Array, w_io: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    # The product itself, not a nested `matmul`: a dot_general that `jax.checkpoint` policies see.
    return _product(x_ni, w_io), (x_ni, w_io)


def _matmul_bwd(res: tuple[jax.Array, jax.Array], dy_no: jax.Array) -> tuple[jax.Array, jax.Array]:
    x_ni, w_io = res
    x_ni, dy_no = jax.lax.optimization_barrier((x_ni, dy_no))
    dx = jnp.dot(dy_no, row_major(w_io.T), preferred_element_type=jnp.float32).astype(x_ni.dtype)
    dw = jnp.dot(row_major(x_ni.T), dy_no, preferred_element_type=jnp.float32).astype(w_io.dtype)
    return dx, dw


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def project(x: jax.Array, w: jax.Array, n_in: int) -> jax.Array:
    """Contract x's last `n_in` axes with w's first `n_in` axes (a projection by a weight), as one
    `matmul`: x [..., in...] w [in..., out...] -> [..., out...]."""
    lead, out = x.shape[: x.ndim - n_in], w.shape[n_in:]
    k = math.prod(w.shape[:n_in])
    y = matmul(x.reshape(-1, k), w.reshape(k, -1))
    return y.reshape(*lead, *out)
