"""Exact expectations over all sequences of a tabular policy (see `tabular`).

The expected gradient of a per-sequence surrogate g(theta; y) under a sampler q is
    E_{y~q}[grad g(theta; y)] = grad_theta sum_y stop_grad(q(y)) g(theta; y),
so enumerating every y gives each KL configuration's expected gradient exactly, and autodiff of
the exact KL gives the truth it should match.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from kljax.rl import estimators as est
from kljax.rl.kl import KLConfig
from kljax.rl.objective import kl_surrogate
from kljax.studies.bias.tabular import TabularSpace, all_sequences, prefix_ids, step_logits, token_logps

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Enumeration:
    """Every sequence of a space with its prefix ids: seqs_nt, ids_nt [N, T]; mask_nt all ones."""

    space: TabularSpace
    seqs_nt: Array
    ids_nt: Array

    @classmethod
    def of(cls, space: TabularSpace) -> Enumeration:
        seqs = all_sequences(space)
        return cls(space, jnp.asarray(seqs), jnp.asarray(prefix_ids(space, seqs)))

    @property
    def mask_nt(self) -> Array:
        return jnp.ones(self.seqs_nt.shape, jnp.float32)

    def logps(self, logits_pv: Array) -> Array:
        return token_logps(logits_pv, self.seqs_nt, self.ids_nt)

    def seq_probs(self, logits_pv: Array) -> Array:
        """pi(y) for every sequence: [N]."""
        return jnp.exp(jnp.sum(self.logps(logits_pv), axis=1))


def reverse_kl_seq(enum: Enumeration, logits_pv: Array, ref_logits_pv: Array) -> Array:
    """KL_seq = sum_y pi(y) log(pi(y)/pi_ref(y)), exactly."""
    logp_n = jnp.sum(enum.logps(logits_pv), axis=1)
    ref_n = jnp.sum(enum.logps(ref_logits_pv), axis=1)
    return jnp.sum(jnp.exp(logp_n) * (logp_n - ref_n))


def forward_kl_seq(enum: Enumeration, logits_pv: Array, ref_logits_pv: Array) -> Array:
    """KL(pi_ref || pi) at the sequence level, exactly."""
    logp_n = jnp.sum(enum.logps(logits_pv), axis=1)
    ref_n = jnp.sum(enum.logps(ref_logits_pv), axis=1)
    return jnp.sum(jnp.exp(ref_n) * (ref_n - logp_n))


def partial_kl(
    enum: Enumeration, logits_pv: Array, ref_logits_pv: Array, prefix_logits_pv: Array, forward: bool = False
) -> Array:
    """sum_t E_{h_t ~ q}[KL_t(h_t)] with the prefix distribution q (from prefix_logits_pv) held fixed.

    Its gradient in logits_pv is the "partial" KL gradient; forward=True uses KL(pi_ref || pi).
    """
    q_n = jax.lax.stop_gradient(enum.seq_probs(prefix_logits_pv))
    logp_ntv = jax.nn.log_softmax(step_logits(logits_pv, enum.ids_nt), axis=-1)
    ref_ntv = jax.nn.log_softmax(step_logits(ref_logits_pv, enum.ids_nt), axis=-1)
    if forward:
        kl_nt = jnp.sum(jnp.exp(ref_ntv) * (ref_ntv - logp_ntv), axis=-1)
    else:
        kl_nt = jnp.sum(jnp.exp(logp_ntv) * (logp_ntv - ref_ntv), axis=-1)
    return jnp.sum(q_n[:, None] * kl_nt)


def expected_surrogate(
    enum: Enumeration,
    config: KLConfig,
    logits_pv: Array,
    ref_logits_pv: Array,
    sampler_logits_pv: Array | None = None,
) -> Array:
    """sum_y stop_grad(q(y)) * kl_surrogate(y): its gradient is the configuration's exact expected
    KL-gradient estimate when y ~ q (q = the sampler, or pi_theta itself when None)."""
    logp_nt = enum.logps(logits_pv)
    ref_nt = enum.logps(ref_logits_pv)
    if sampler_logits_pv is None:
        sampler_nt = None
        q_n = jnp.exp(jnp.sum(logp_nt, axis=1))
    else:
        sampler_nt = enum.logps(sampler_logits_pv)
        q_n = jnp.exp(jnp.sum(sampler_nt, axis=1))
    full_nt = None
    if config.estimator == "full":
        full_nt = est.full_kl_from_logits(
            step_logits(logits_pv, enum.ids_nt), step_logits(ref_logits_pv, enum.ids_nt)
        )
    g_n = kl_surrogate(config, logp_nt, ref_nt, enum.mask_nt, sampler_nt, full_nt)
    return jnp.sum(jax.lax.stop_gradient(q_n) * g_n)


def exact_gradient(
    enum: Enumeration,
    config: KLConfig,
    logits_pv: Array,
    ref_logits_pv: Array,
    sampler_logits_pv: Array | None = None,
) -> Array:
    """The configuration's exact expected KL gradient (beta = 1), [P, V]."""
    return jax.grad(expected_surrogate, argnums=2)(enum, config, logits_pv, ref_logits_pv, sampler_logits_pv)


def true_gradient(
    enum: Enumeration, logits_pv: Array, ref_logits_pv: Array, objective: Callable = reverse_kl_seq
) -> Array:
    """grad of the exact objective (default: the sequence-level reverse KL), [P, V]."""
    return jax.grad(objective, argnums=1)(enum, logits_pv, ref_logits_pv)
