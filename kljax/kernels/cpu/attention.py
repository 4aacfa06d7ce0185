"""XLA-CPU grouped-query attention over a whole sequence, with a hand-written backward.

q [B, T, H, Dh], k / v [B, S, Kv, Dh], allowed [B, T, S] -> out [B, T, H, Dh]. Heads-major inside: the
G = H / Kv query heads sharing a key head are the rows of one [G T, Dh] x [Dh, S] product per (b, kv head),
on operands already in matmul layout. With c = Dh^-1/2, in float32,
    s = c q k^T  where allowed, else -1e30 (finite: a fully masked row is uniform, never NaN)
    m = max_s s,  l = sum_s exp(s - m),  p = exp(s - m) / l,  out = p v   (p in the compute dtype there)
The backward recomputes s and p from q, k and the saved m, l (p is exactly the forward's), then, as
FlashAttention's backward (delta from the output: sum_s p dp = sum_d dout out, no second pass over s),
    dp = dout v^T,  delta = sum_d dout * out,  ds = p (dp - delta) where allowed, else 0
    dq = c ds k,    dk = c ds^T q,    dv = p^T dout
On one CPU device both passes run over blocks of batch rows (`cpu_batch_group`) whose scores stay
cache-sized. Why by hand: autodiff of the softmax on XLA CPU materialized broadcast masks of the full scores
and fused its reductions into slow dot fusions (docs/performance.md). Equal to `jax.nn.dot_product_attention`
in value and gradient: tests/test_kernels.py, tests/test_attention.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kljax.kernels.cpu.matmul import row_major
from kljax.parallel.sharding import on_one_cpu_device

NEG = -1e30
CPU_SCORES_BLOCK = 1 << 21  # float32 score elements per block of batch rows on CPU (8 MB)


def _rows_major(x_bthk: jax.Array, kv: int) -> jax.Array:
    """q-shaped [B, T, H, Dh] -> [B, Kv, G T, Dh], row-major (the G heads sharing a kv head as rows).

    Row-major copies here and in `_kv_major`: XLA CPU turns a 16-bit dot with a transposed operand
    into a float32 dot."""
    b, t, h, dh = x_bthk.shape
    return row_major(x_bthk.reshape(b, t, kv, h // kv, dh).transpose(0, 2, 3, 1, 4).reshape(b, kv, h // kv * t, dh))


def _kv_major(x_bsgk: jax.Array) -> jax.Array:
    """k / v [B, S, Kv, Dh] -> [B, Kv, S, Dh], row-major."""
    return row_major(x_bsgk.transpose(0, 2, 1, 3))


def _tokens_major(x_bkmd: jax.Array, t: int) -> jax.Array:
    """[B, Kv, G T, Dh] -> [B, T, Kv G, Dh] (the inverse of `_rows_major`)."""
    b, kv, m, dh = x_bkmd.shape
    return x_bkmd.reshape(b, kv, m // t, t, dh).transpose(0, 3, 1, 2, 4).reshape(b, t, kv * (m // t), dh)


def _where_allowed(x_bkms: jax.Array, allowed_bts: jax.Array, g: int, fill: float) -> jax.Array:
    """x [B, Kv, G T, S] where allowed[b, t, s] (for each of the G heads of row t), else fill."""
    b, kv, m, s_len = x_bkms.shape
    x = x_bkms.reshape(b, kv, g, m // g, s_len)
    return jnp.where(allowed_bts[:, None, None], x, fill).reshape(b, kv, m, s_len)


def _scores(q, k, allowed_bts, g: int) -> jax.Array:
    """s [B, Kv, G T, S] float32, masked."""
    s = jnp.einsum("bkmd,bksd->bkms", q, k, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
    return _where_allowed(s, allowed_bts, g, NEG)


def _forward_whole(q_bthk, k_bsgk, v_bsgk, allowed_bts):
    t, h, kv = q_bthk.shape[1], q_bthk.shape[2], k_bsgk.shape[2]
    q, k, v = _rows_major(q_bthk, kv), _kv_major(k_bsgk), _kv_major(v_bsgk)
    s = _scores(q, k, allowed_bts, h // kv)
    m = jnp.max(s, axis=-1)
    e = jnp.exp(s - m[..., None])
    lsum = jnp.sum(e, axis=-1)
    p = (e / lsum[..., None]).astype(v.dtype)
    out = jnp.einsum("bkms,bksd->bkmd", p, v, preferred_element_type=jnp.float32).astype(v.dtype)
    return _tokens_major(out, t), (m, lsum)


def cpu_batch_group(b: int, scores_per_row: int) -> int:
    """Batch rows per block on one CPU device: the largest divisor of b whose float32 scores fit
    in `CPU_SCORES_BLOCK` elements (at least 1); b elsewhere, or under a mesh of more than one
    device (whose batch sharding the blocks would cut across)."""
    if not on_one_cpu_device():
        return b
    most = max(1, CPU_SCORES_BLOCK // max(1, scores_per_row))
    return max(c for c in range(1, min(b, most) + 1) if b % c == 0)


def _in_blocks(fn, b: int, c: int, *arrays):
    """fn over blocks of c batch rows of every array (lax.map), outputs joined back; fn itself if c == b."""
    if c == b:
        return fn(*arrays)
    split = lambda x: x.reshape(b // c, c, *x.shape[1:])
    out = jax.lax.map(lambda a: fn(*a), jax.tree.map(split, arrays))
    return jax.tree.map(lambda x: x.reshape(b, *x.shape[2:]), out)


def _group(q_bthk, k_bsgk) -> int:
    return cpu_batch_group(q_bthk.shape[0], q_bthk.shape[2] * q_bthk.shape[1] * k_bsgk.shape[1])


def _forward(q_bthk, k_bsgk, v_bsgk, allowed_bts):
    return _in_blocks(_forward_whole, q_bthk.shape[0], _group(q_bthk, k_bsgk), q_bthk, k_bsgk, v_bsgk, allowed_bts)


@jax.custom_vjp
def attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array, allowed_bts: jax.Array) -> jax.Array:
    """Grouped-query attention (module docstring); out [B, T, H, Dh] in q's dtype."""
    return _forward(q_bthk, k_bsgk, v_bsgk, allowed_bts)[0]


def _fwd(q_bthk, k_bsgk, v_bsgk, allowed_bts):
    out, (m, lsum) = _forward(q_bthk, k_bsgk, v_bsgk, allowed_bts)
    return out, (q_bthk, k_bsgk, v_bsgk, allowed_bts, out, m, lsum)


def _bwd(res, dout_bthk):
    q_bthk, k_bsgk = res[0], res[1]
    grads = _in_blocks(_bwd_whole, q_bthk.shape[0], _group(q_bthk, k_bsgk), *res, dout_bthk)
    return (*grads, None)


def _bwd_whole(q_bthk, k_bsgk, v_bsgk, allowed_bts, out_bthk, m, lsum, dout_bthk):
    """The backward of one block (module docstring). dk and dv are formed transposed (q^T ds, dout^T p: the
    small operands are the ones transposed) and transposed back: XLA CPU's matmul kernels want row-major
    operands."""
    t, h, kv, dh = q_bthk.shape[1], q_bthk.shape[2], k_bsgk.shape[2], q_bthk.shape[3]
    dt = v_bsgk.dtype
    q, k, v = _rows_major(q_bthk, kv), _kv_major(k_bsgk), _kv_major(v_bsgk)
    dout, out = _rows_major(dout_bthk.astype(dt), kv), _rows_major(out_bthk, kv)
    s = _scores(q, k, allowed_bts, h // kv)
    p = jnp.exp(s - m[..., None]) / lsum[..., None]
    p16 = p.astype(dt)
    dp = jnp.einsum("bkmd,bksd->bkms", dout, v, preferred_element_type=jnp.float32)
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    # masked scores are constants: no gradient (p is not 0 there in a fully masked row)
    ds = _where_allowed(p * (dp - delta[..., None]) * (dh**-0.5), allowed_bts, h // kv, 0.0).astype(dt)
    dq = jnp.einsum("bkms,bksd->bkmd", ds, k, preferred_element_type=jnp.float32)
    mt = lambda x: jnp.swapaxes(x, -1, -2)
    dk = mt(jnp.einsum("bkdm,bkms->bkds", row_major(mt(q)), ds, preferred_element_type=jnp.float32))
    dv = mt(jnp.einsum("bkdm,bkms->bkds", row_major(mt(dout)), p16, preferred_element_type=jnp.float32))
    dq = _tokens_major(dq, t).astype(q_bthk.dtype)
    back = lambda x: x.transpose(0, 2, 1, 3).astype(k_bsgk.dtype)  # [B, Kv, S, Dh] -> [B, S, Kv, Dh]
    return dq, back(dk), back(dv)


attention.defvjp(_fwd, _bwd)
