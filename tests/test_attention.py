"""`attention`: values and hand-written backward against autodiff of the plain softmax attention,
grouped heads, causal and padding masks (a fully masked row included), float32 and bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_dots import dot_operand_types

from kljax.kernels.cpu.attention import NEG, attention

B, T, H, KV, DH = 2, 12, 6, 2, 8


def _plain(q, k, v, allowed):
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), k.astype(jnp.float32)) * q.shape[-1] ** -0.5
    s = jnp.where(allowed[:, None], s, NEG)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))


def _inputs(dtype, seed=0):
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (B, T, H, DH)).astype(dtype)
    k = jax.random.normal(kk, (B, T, KV, DH)).astype(dtype)
    v = jax.random.normal(kv, (B, T, KV, DH)).astype(dtype)
    mask = np.ones((B, T), bool)
    mask[1, :4] = False  # left padding in row 1: its first 4 queries see no key at all
    allowed = np.tril(np.ones((T, T), bool))[None] & mask[:, None, :]
    cot = jax.random.normal(kg, (B, T, H, DH))
    return q, k, v, jnp.asarray(allowed), cot


def _loss(fn, allowed, cot):
    return lambda q, k, v: jnp.sum(fn(q, k, v, allowed).astype(jnp.float32) * cot)


def test_float32_values_and_gradients_equal_autodiff():
    q, k, v, allowed, cot = _inputs(jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(attention)(q, k, v, allowed)),
                               np.asarray(_plain(q, k, v, allowed)), rtol=1e-5, atol=1e-5)
    ours = jax.jit(jax.grad(_loss(attention, allowed, cot), argnums=(0, 1, 2)))(q, k, v)
    ref = jax.grad(_loss(_plain, allowed, cot), argnums=(0, 1, 2))(q, k, v)
    for x, y in zip(ours, ref, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_bfloat16_gradients_are_close_and_dots_keep_bfloat16_operands():
    q, k, v, allowed, cot = _inputs(jnp.bfloat16)
    fn = jax.jit(jax.grad(_loss(attention, allowed, cot), argnums=(0, 1, 2)))
    ours = fn(q, k, v)
    f32 = lambda x: x.astype(jnp.float32)
    ref = jax.grad(_loss(_plain, allowed, cot), argnums=(0, 1, 2))(f32(q), f32(k), f32(v))
    for x, y in zip(ours, ref, strict=True):
        assert x.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(f32(x)), np.asarray(y), atol=4e-2 * float(jnp.max(jnp.abs(y))))
    if jax.default_backend() != "cpu":
        return
    hlo = fn.lower(q, k, v).compile().as_text()
    dots = dot_operand_types(hlo)
    assert len(dots) >= 5  # the scores (recomputed), dp, dq, dk, dv
    for types in dots:
        assert types == ("bf16", "bf16"), hlo


@pytest.mark.parametrize("kv", [1, 3, 6])
def test_grouping_of_heads_is_the_plain_repeat(kv):
    q, _, _, allowed, cot = _inputs(jnp.float32)
    k = jax.random.normal(jax.random.key(5), (B, T, kv, DH))
    v = jax.random.normal(jax.random.key(6), (B, T, kv, DH))
    np.testing.assert_allclose(np.asarray(attention(q, k, v, allowed)), np.asarray(_plain(q, k, v, allowed)),
                               rtol=1e-5, atol=1e-5)
    ours = jax.grad(_loss(attention, allowed, cot), argnums=(1, 2))(q, k, v)
    ref = jax.grad(_loss(_plain, allowed, cot), argnums=(1, 2))(q, k, v)
    for x, y in zip(ours, ref, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_blocks_of_batch_rows_equal_the_whole_batch(monkeypatch):
    import kljax.kernels.cpu.attention as attn

    q, k, v, allowed, cot = _inputs(jnp.float32)
    grad = lambda: jax.grad(_loss(attention, allowed, cot), argnums=(0, 1, 2))(q, k, v)
    monkeypatch.setattr(attn, "CPU_SCORES_BLOCK", 1 << 40)
    whole_out, whole_grads = attention(q, k, v, allowed), grad()
    monkeypatch.setattr(attn, "CPU_SCORES_BLOCK", 1)  # one batch row per block (on CPU)
    assert attn.cpu_batch_group(B, H * T * T) == (1 if jax.default_backend() == "cpu" else B)
    for x, y in zip((attention(q, k, v, allowed), *grad()), (whole_out, *whole_grads), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
