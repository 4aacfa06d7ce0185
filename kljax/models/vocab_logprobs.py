"""Token log-probs (and entropy) over the full vocabulary for one chunk of hidden states, with a
hand-written backward that never keeps the logits.

For hidden states h [N, D], the unembedding W ([V, D] tied or [D, V] untied, in the compute dtype)
and targets t [N], with z = (h W^T) / temperature in float32 and p = softmax(z):
    lse_n     = log sum_v exp(z_nv)
    logp_n    = z_{n, t_n} - lse_n
    entropy_n = lse_n - sum_v p_nv z_nv
The backward recomputes z from (h, W) and uses, for cotangents g (logp) and e (entropy),
    dL/dz_nv = g_n (1[v = t_n] - p_nv) - e_n p_nv (z_nv - lse_n + entropy_n)
    dh = (dL/dz / temperature) W,   dW = (dL/dz / temperature)^T h
with dL/dz cast to the compute dtype before the two products (as `matmul.matmul`'s backward). Only h, W,
t, lse and entropy are saved. Why not autodiff under `jax.checkpoint`: on XLA CPU it ran both vocabulary
products in float32 and the exponential-sum as one slow reduction over the whole chunk (docs/performance.md);
here the row reductions run over blocks of `CPU_ROW_BLOCK` rows on CPU (`_row_blocks`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kljax.kernels.cpu.matmul import row_major
from kljax.parallel.sharding import on_one_cpu_device

CPU_ROW_BLOCK = 128  # rows per block of the vocabulary reductions on CPU (cache-sized: 128 x V float32)


def vocab_logits(h_nd: jax.Array, w: jax.Array, vocab_major: bool, temperature: float = 1.0) -> jax.Array:
    """z [..., V] float32 = (h W^T) / temperature for h [..., D], W [V, D] if vocab_major else [D, V]."""
    spec = "...d,vd->...v" if vocab_major else "...d,dv->...v"
    z = jnp.einsum(spec, h_nd, w, preferred_element_type=jnp.float32)
    return z if temperature == 1.0 else z / temperature


def _stats(z_nv: jax.Array, with_entropy: bool) -> tuple[jax.Array, jax.Array]:
    """(lse [N], entropy [N] or zeros) of the rows of z."""
    m = jnp.max(z_nv, axis=-1)
    shifted = z_nv - m[:, None]
    e = jnp.exp(shifted)
    s = jnp.sum(e, axis=-1)
    lse = m + jnp.log(s)
    if not with_entropy:
        return lse, jnp.zeros_like(lse)
    # entropy = lse - sum p z = log s - sum e (z - m) / s
    return lse, jnp.log(s) - jnp.sum(e * shifted, axis=-1) / s


def _row_blocks(z_nv: jax.Array, with_entropy: bool) -> tuple[jax.Array, jax.Array]:
    """`_stats` over blocks of rows on one CPU device (one block elsewhere, under a mesh of more than
    one device, whose batch sharding the blocks would cut across, or when the rows do not divide)."""
    n, v = z_nv.shape
    rows = CPU_ROW_BLOCK
    if not on_one_cpu_device() or n <= rows or n % rows:
        return _stats(z_nv, with_entropy)
    lse, ent = jax.lax.map(lambda zb: _stats(zb, with_entropy), z_nv.reshape(n // rows, rows, v))
    return lse.reshape(n), ent.reshape(n)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def vocab_logprobs(
    h_nd: jax.Array, w: jax.Array, targets_n: jax.Array, vocab_major: bool, temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """(logp [N], entropy [N]) float32 of targets_n under softmax(h_nd W^T / temperature); the
    entropy is zeros unless with_entropy. W: [V, D] if vocab_major (tied embedding) else [D, V]."""
    logp, ent, _ = _forward(h_nd, w, targets_n, vocab_major, temperature, with_entropy)
    return logp, ent


def _forward(h_nd, w, targets_n, vocab_major, temperature, with_entropy):
    z = vocab_logits(h_nd, w, vocab_major, temperature)
    lse, ent = _row_blocks(z, with_entropy)
    logp = jnp.take_along_axis(z, targets_n[:, None], axis=-1)[:, 0] - lse
    return logp, ent, lse


def _fwd(h_nd, w, targets_n, vocab_major, temperature, with_entropy):
    h_nd, w, targets_n = h_nd.value, w.value, targets_n.value  # symbolic_zeros=True wraps the primals
    logp, ent, lse = _forward(h_nd, w, targets_n, vocab_major, temperature, with_entropy)
    return (logp, ent), (h_nd, w, targets_n, lse, ent)


def _bwd(vocab_major, temperature, with_entropy, res, cotangents):
    h_nd, w, targets_n, lse, ent = res
    g_logp, g_ent = cotangents
    zero = lambda g: isinstance(g, jax.custom_derivatives.SymbolicZero)
    if zero(g_logp):
        g_logp = jnp.zeros_like(lse)
    z = vocab_logits(h_nd, w, vocab_major, temperature)
    p = jnp.exp(z - lse[:, None])
    hit = jnp.arange(z.shape[-1], dtype=targets_n.dtype)[None] == targets_n[:, None]
    gz = g_logp[:, None] * (hit.astype(jnp.float32) - p)
    if with_entropy and not zero(g_ent):  # a stop_gradient'ed entropy costs nothing here
        gz = gz - g_ent[:, None] * p * (z - lse[:, None] + ent[:, None])
    if temperature != 1.0:
        gz = gz / temperature
    gz = gz.astype(h_nd.dtype)
    if vocab_major:  # W [V, D]: dh = gz W, dW = (h^T gz)^T (h^T is small; gz^T would be [V, N])
        dh = jnp.dot(gz, w, preferred_element_type=jnp.float32)
        dw_dv = jnp.dot(row_major(h_nd.T), gz, preferred_element_type=jnp.float32).astype(w.dtype)
        dw = jax.lax.optimization_barrier(dw_dv).T
    else:  # W [D, V]: dh = gz W^T, dW = h^T gz
        dh = jnp.dot(gz, row_major(w.T), preferred_element_type=jnp.float32)
        dw = jnp.dot(row_major(h_nd.T), gz, preferred_element_type=jnp.float32).astype(w.dtype)
    return dh.astype(h_nd.dtype), dw, None


vocab_logprobs.defvjp(_fwd, _bwd, symbolic_zeros=True)
