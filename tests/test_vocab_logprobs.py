"""`vocab_logprobs`: its values and its hand-written backward against autodiff of the plain formula
(log-softmax over the vocabulary), tied and untied, with temperature and entropy, on one block of
rows and on several (the CPU row blocks), and bfloat16 products that stay bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_dots import dot_operand_types

from kljax.models import vocab_logprobs as vl

D, V = 16, 50


def _inputs(n, vocab_major, dtype=jnp.float32, seed=0):
    k = jax.random.split(jax.random.key(seed), 5)
    h = jax.random.normal(k[0], (n, D)).astype(dtype)
    w = jax.random.normal(k[1], (V, D) if vocab_major else (D, V)).astype(dtype)
    t = jax.random.randint(k[2], (n,), 0, V)
    a, b = jax.random.normal(k[3], (n,)), jax.random.normal(k[4], (n,))
    return h, w, t, a, b


def _plain(h, w, t, vocab_major, temperature, with_entropy):
    z = (h.astype(jnp.float32) @ (w.T if vocab_major else w).astype(jnp.float32)) / temperature
    logp_all = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(logp_all, t[:, None], axis=-1)[:, 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1) if with_entropy else jnp.zeros_like(logp)
    return logp, ent


def _loss(fn, vocab_major, temperature, with_entropy):
    def loss(h, w, t, a, b):
        logp, ent = fn(h, w, t, vocab_major, temperature, with_entropy)
        return jnp.sum(a * logp) + jnp.sum(b * ent)
    return loss


# 300 rows: one block (not a multiple of the CPU block); 384: three blocks of 128
@pytest.mark.parametrize("n", [300, 384])
@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("temperature, with_entropy", [(1.0, False), (1.0, True), (0.7, True)])
def test_values_and_gradients_equal_autodiff_of_the_plain_formula(n, vocab_major, temperature, with_entropy):
    h, w, t, a, b = _inputs(n, vocab_major)
    ours = jax.jit(vl.vocab_logprobs, static_argnums=(3, 4, 5))(h, w, t, vocab_major, temperature, with_entropy)
    ref = _plain(h, w, t, vocab_major, temperature, with_entropy)
    for x, y in zip(ours, ref, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
    grad = lambda fn: jax.jit(jax.grad(_loss(fn, vocab_major, temperature, with_entropy), argnums=(0, 1)))
    for x, y in zip(grad(vl.vocab_logprobs)(h, w, t, a, b), grad(_plain)(h, w, t, a, b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_a_stop_gradient_entropy_leaves_the_gradient_of_logp():
    h, w, t, a, _ = _inputs(256, True)

    def with_ent(h, w):
        logp, ent = vl.vocab_logprobs(h, w, t, True, 1.0, True)
        return jnp.sum(a * logp) + 0.0 * jnp.sum(jax.lax.stop_gradient(ent))

    def without(h, w):
        return jnp.sum(a * vl.vocab_logprobs(h, w, t, True, 1.0, False)[0])

    for x, y in zip(jax.grad(with_ent, argnums=(0, 1))(h, w), jax.grad(without, argnums=(0, 1))(h, w), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_row_blocks_equal_one_block():
    z = jax.random.normal(jax.random.key(1), (4 * vl.CPU_ROW_BLOCK, V)) * 5
    blocked = vl._row_blocks(z, True)
    whole = vl._stats(z, True)
    for x, y in zip(blocked, whole, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("vocab_major", [True, False])
def test_bfloat16_gradient_is_close_and_its_dots_keep_bfloat16_operands(vocab_major):
    h, w, t, a, b = _inputs(256, vocab_major, jnp.bfloat16)
    loss = _loss(vl.vocab_logprobs, vocab_major, 1.0, True)
    fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
    ours = fn(h, w, t, a, b)
    ref = jax.grad(_loss(_plain, vocab_major, 1.0, True), argnums=(0, 1))(
        h.astype(jnp.float32), w.astype(jnp.float32), t, a, b)
    for x, y in zip(ours, ref, strict=True):
        assert x.dtype == jnp.bfloat16
        scale = float(jnp.max(jnp.abs(y)))
        np.testing.assert_allclose(np.asarray(x.astype(jnp.float32)), np.asarray(y), atol=3e-2 * scale)
    if jax.default_backend() != "cpu":
        return
    hlo = fn.lower(h, w, t, a, b).compile().as_text()
    dots = dot_operand_types(hlo)
    assert len(dots) >= 3  # the logits (forward, maybe recomputed), dh and dW
    for types in dots:
        assert types == ("bf16", "bf16"), hlo
