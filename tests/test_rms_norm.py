"""`rms_norm`'s hand-written weight gradient equals autodiff of the plain formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.kernels.cpu.rms_norm import _scale, rms_norm


def _plain(x, w, eps):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * x32.astype(x.dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_matches_autodiff(dtype):
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(k[0], (3, 40, 24)).astype(dtype)
    w = 1 + 0.1 * jax.random.normal(k[1], (24,))
    g = jax.random.normal(k[2], (3, 40, 24))
    loss = lambda f: lambda x, w: (f(x, w, 1e-5).astype(jnp.float32) * g).sum()
    f32 = lambda a: np.asarray(a, np.float32)
    np.testing.assert_array_equal(f32(rms_norm(x, w, 1e-5)), f32(_plain(x, w, 1e-5)))
    got = jax.grad(loss(rms_norm), (0, 1))(x, w)
    want = jax.grad(loss(_plain), (0, 1))(x, w)
    tol = 1e-5 if dtype == jnp.float32 else 3e-2
    # bfloat16: dx only (autodiff's own dw sums the rows in bfloat16; the float32 row sum is
    # checked against an exact sum below)
    for a, b in zip(got if dtype == jnp.float32 else got[:1], want if dtype == jnp.float32 else want[:1],
                    strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= tol * (1 + np.abs(b).max())


def test_scale_weight_gradient_is_float32_row_sum():
    k = jax.random.split(jax.random.PRNGKey(1), 2)
    xn = jax.random.normal(k[0], (4096, 8)).astype(jnp.bfloat16)
    g = jax.random.normal(k[1], (4096, 8)).astype(jnp.bfloat16)
    _, vjp = jax.vjp(_scale, xn, jnp.ones((8,)))
    dw = vjp(g)[1]
    exact = (np.asarray(g, np.float64) * np.asarray(xn, np.float64)).sum(0)
    np.testing.assert_allclose(np.asarray(dw), exact, rtol=1e-5, atol=1e-3)
