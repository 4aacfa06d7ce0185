"""The model's projection matmul (`kljax.kernels.cpu.matmul.matmul`) and its hand-written backward: the same
gradients as autodiff of a plain dot, and on CPU bfloat16 dots that stay bfloat16 (XLA CPU turns
a dot with a column-major 16-bit operand into a float32 dot, about 4x slower here)."""

import jax
import jax.numpy as jnp
import numpy as np
from hlo_dots import dot_operand_types

from kljax.kernels.cpu import matmul as mm


def _inputs(dtype):
    kx, kw, kr = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (64, 96), jnp.float32).astype(dtype)
    w = (0.1 * jax.random.normal(kw, (96, 160), jnp.float32)).astype(dtype)
    r = jax.random.normal(kr, (64, 160), jnp.float32)
    return x, w, r


def _loss(matmul):
    return lambda x, w, r: jnp.sum(matmul(x, w).astype(jnp.float32) * r)


def test_gradients_equal_autodiff_of_a_plain_dot():
    plain = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
        x, w, r = _inputs(dtype)
        ours = jax.jit(jax.grad(_loss(mm.matmul), argnums=(0, 1)))(x, w, r)
        ref = jax.jit(jax.grad(_loss(plain), argnums=(0, 1)))(x, w, r)
        for a, b in zip(ours, ref, strict=True):
            assert a.dtype == b.dtype == dtype
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(b))


def test_bfloat16_backward_dots_keep_bfloat16_operands_on_cpu():
    x, w, r = _inputs(jnp.bfloat16)
    hlo = jax.jit(jax.grad(_loss(mm.matmul), argnums=(0, 1))).lower(x, w, r).compile().as_text()
    dots = dot_operand_types(hlo)
    assert len(dots) == 2  # dx and dw (the forward's output is not needed for the gradient)
    for types in dots:
        assert types == ("bf16", "bf16"), hlo
