"""Every KL configuration's gradient estimate, per sequence, in logit space; and the statistics
(bias, variance, MSE, cosine) of a batch estimate from its moments.

For a configuration c, `kljax.rl.objective.kl_surrogate` (the trainer's objective with the KL part alone)
gives one scalar S_c(theta; y) per sequence whose gradient is the configuration's single-sample KL-gradient
estimate g_c(y) (beta = 1), exactly as the trainer differentiates it. With y ~ q (the sampler mu, or
pi_theta on-policy) and B samples a batch:
    expected gradient   m_c = E_q[g_c(y)]
    true gradient       g*  = grad KL_seq(pi_theta || pi_ref)
    relative bias       ||m_c - g*|| / ||g*||
    variance            tr Cov(batch mean) = (E_q||g_c||^2 - ||m_c||^2) / B
    mse                 E||batch mean - g*||^2 = ||m_c - g*||^2 + variance
    cosine              <m_c, g*> / (||m_c|| ||g*||)
`per_sequence` gives each sequence's dS_c/d logits [K, N, T, V] (the policy pulls them back to parameters);
a last "reward" stream studies the whole loss as a function of beta (`total_loss_stats`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from kljax.rl import estimators as est
from kljax.rl.kl import KLConfig
from kljax.rl.objective import Objective, kl_surrogate, sequence_losses
from kljax.studies.bias.policies import sequence_logps

Array = jax.Array


def toy_reward_masked(seqs_nt: Array, mask_nt: Array, vocab: int) -> Array:
    """R(y) = fraction of unmasked positions with y_t == t mod V, [N] (the toy task of `setting`)."""
    hit_nt = (seqs_nt == jnp.arange(seqs_nt.shape[1]) % vocab).astype(mask_nt.dtype)
    return jnp.sum(hit_nt * mask_nt, axis=1) / jnp.maximum(jnp.sum(mask_nt, axis=1), 1.0)


def length_mask(seqs_nt: Array, length: Array | int, dtype=jnp.float64) -> tuple[Array, Array]:
    """(mask_nt [N, T]: t < length, canonical_n [N]: 1 where every token from `length` on is 0)."""
    t = jnp.arange(seqs_nt.shape[1])
    mask = (t < length)[None, :]
    canonical = jnp.all((seqs_nt == 0) | mask, axis=1)
    return jnp.broadcast_to(mask, seqs_nt.shape).astype(dtype), canonical.astype(dtype)


def surrogate_n(
    config: KLConfig,
    seqs_nt: Array,
    mask_nt: Array,
    logits_ntv: Array,
    ref_logits_ntv: Array,
    sampler_logits_ntv: Array,
) -> Array:
    """kl_surrogate of each sequence, [N], as a function of the policy's logits [N, T, V]."""
    logp_nt = sequence_logps(logits_ntv, seqs_nt)
    ref_nt = sequence_logps(ref_logits_ntv, seqs_nt)
    sampler_nt = jax.lax.stop_gradient(sequence_logps(sampler_logits_ntv, seqs_nt))
    full_nt = est.full_kl_from_logits(logits_ntv, ref_logits_ntv) if config.estimator == "full" else None
    return kl_surrogate(config, logp_nt, ref_nt, mask_nt, sampler_nt, full_nt)


def reward_surrogate_n(
    seqs_nt: Array, mask_nt: Array, logits_ntv: Array, sampler_logits_ntv: Array, advantage_n: Array
) -> Array:
    """-(R - b) * sum_t w_t per sequence, [N]: the objective's unclipped policy-gradient term with no
    KL, whose gradient is the REINFORCE loss gradient."""
    logp_nt = sequence_logps(logits_ntv, seqs_nt)
    sampler_nt = sequence_logps(sampler_logits_ntv, seqs_nt)
    no_kl = Objective(KLConfig(placement="none"), clip_low=None)
    adv_nt = jnp.broadcast_to(advantage_n[:, None], logp_nt.shape)
    return sequence_losses(no_kl, logp_nt, sampler_nt, logp_nt, adv_nt, mask_nt, 0.0)[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PerSequence:
    """cots_kntv: [K+1, N, T, V] per-sequence logit gradients (configs, then the reward stream);
    q_n: [N] sampler probability of each (canonical) sequence; log_w_n: [N] log prod_t pi/mu;
    reward_n: [N] toy reward."""

    cots_kntv: Array
    q_n: Array
    log_w_n: Array
    reward_n: Array


@functools.partial(jax.jit, static_argnums=(0, 1))
def per_sequence(
    configs: tuple[KLConfig, ...],
    vocab: int,
    seqs_nt: Array,
    length: Array,
    logits_ntv: Array,
    ref_logits_ntv: Array,
    sampler_logits_ntv: Array,
    baseline: Array,
) -> PerSequence:
    """Per-sequence gradients of every configuration's surrogate (and the reward stream) w.r.t. the
    policy's logits, for responses truncated to `length` tokens. Each sequence's surrogate depends
    on its own logits only, so the gradient of the sum holds every sequence's gradient at once.

    It depends on the configurations and the shapes only, not on the policy, so one compilation serves the
    exact mode (all sequences, weights q(y)), the Monte-Carlo mode (samples, weights 1/B) and every policy.
    Responses shorter than the policy's length T are studied with a mask (positions t >= T' masked): the
    length-T' problem is the first T' tokens of the same policy. In exact mode only the canonical sequences
    (zeros after T') carry weight, so each length-T' response is counted once."""
    dtype = logits_ntv.dtype
    mask, canonical = length_mask(seqs_nt, length, dtype)
    ref_logits_ntv = jax.lax.stop_gradient(ref_logits_ntv)
    sampler_logits_ntv = jax.lax.stop_gradient(sampler_logits_ntv)
    reward = toy_reward_masked(seqs_nt, mask, vocab)
    advantage = reward - baseline
    cots = []
    for config in configs:
        f = lambda lg, c=config: jnp.sum(surrogate_n(c, seqs_nt, mask, lg, ref_logits_ntv, sampler_logits_ntv))
        cots.append(jax.grad(f)(logits_ntv))
    f = lambda lg: jnp.sum(reward_surrogate_n(seqs_nt, mask, lg, sampler_logits_ntv, advantage))
    cots.append(jax.grad(f)(logits_ntv))
    logp = sequence_logps(logits_ntv, seqs_nt) * mask
    sampler_logp = sequence_logps(sampler_logits_ntv, seqs_nt) * mask
    q = jnp.exp(jnp.sum(sampler_logp, axis=1)) * canonical
    return PerSequence(jnp.stack(cots), q, jnp.sum(logp - sampler_logp, axis=1), reward)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Moments:
    """Moments of the single-sample gradient estimates under the sampler q, for K+1 streams.

    mean_kd: [K+1, D] E_q[g_k];  sq_k: [K+1] E_q||g_k||^2;  cross_k: [K+1] E_q<g_k, g_reward>;
    truncated_k: [K] q-probability that each configuration's truncated sequence weight clips."""

    mean_kd: Array
    sq_k: Array
    cross_k: Array
    truncated_k: Array

    def __add__(self, other: Moments) -> Moments:
        return jax.tree_util.tree_map(lambda a, b: a + b, self, other)


def truncation_fraction(configs: tuple[KLConfig, ...], log_w_n: np.ndarray, q_n: np.ndarray) -> np.ndarray:
    """[K] sum_n q_n [W_n > truncation] for configs with a truncation (0 for the others)."""
    out = np.zeros(len(configs))
    for i, c in enumerate(configs):
        if c.truncation is not None:
            out[i] = float(np.sum(q_n * (log_w_n > np.log(c.truncation))))
    return out


def _norm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sqrt(np.sum(np.square(x), axis=axis))


def cosine(a_kd: np.ndarray, b_d: np.ndarray) -> np.ndarray:
    """Cosine of each row of a with b: [K]; 0 where a row is zero to rounding (||a|| < 1e-9 ||b||)."""
    na, nb = _norm(a_kd), _norm(b_d)
    ok = na > 1e-9 * nb
    return np.where(ok, (a_kd @ b_d) / np.where(ok, na * nb, 1.0), 0.0)


def stats_from_moments(moments: Moments, truth_d: np.ndarray, samples: int) -> dict[str, np.ndarray]:
    """Exact statistics of a B-sample batch estimate (B = samples) of each configuration (the first
    K streams): relative_bias, variance, mse, cosine, relative_rmse, variance_per_sample,
    truncated_fraction, true_norm; each [K]."""
    k = moments.truncated_k.shape[0]
    mean = np.asarray(moments.mean_kd, np.float64)[:k]
    sq = np.asarray(moments.sq_k, np.float64)[:k]
    g = np.asarray(truth_d, np.float64)
    true_norm = float(_norm(g))
    bias = _norm(mean - g[None])
    var1 = np.maximum(sq - np.sum(mean * mean, axis=1), 0.0)
    var = var1 / samples
    mse = bias**2 + var
    return {
        "relative_bias": bias / true_norm,
        "variance": var,
        "mse": mse,
        "cosine": cosine(mean, g),
        "relative_rmse": np.sqrt(mse) / true_norm,
        "variance_per_sample": var1,
        "truncated_fraction": np.asarray(moments.truncated_k, np.float64),
        "true_norm": np.full(k, true_norm),
    }


def total_loss_stats(
    moments: Moments, kl_grad: np.ndarray, reward_loss_grad: np.ndarray, beta: float, samples: int
) -> dict[str, np.ndarray]:
    """Statistics of the whole RL loss gradient estimate, REINFORCE part + beta * KL part, per
    configuration; the truth is -grad E[R] + beta grad KL_seq. Shows how much a configuration's KL
    bias matters at a given beta. Each [K]. The REINFORCE part is the last "reward" stream,
    S_R(y) = -(R(y) - b) * sum_t w_t (through the token ratio w_t, constant baseline b)."""
    mean = np.asarray(moments.mean_kd, np.float64)
    sq = np.asarray(moments.sq_k, np.float64)
    cross = np.asarray(moments.cross_k, np.float64)
    m_r, m_k = mean[-1], mean[:-1]
    g = np.asarray(reward_loss_grad, np.float64) + beta * np.asarray(kl_grad, np.float64)
    expected = m_r[None] + beta * m_k
    var_r = sq[-1] - m_r @ m_r
    var_k = sq[:-1] - np.sum(m_k * m_k, axis=1)
    cov = cross[:-1] - m_k @ m_r
    var = np.maximum(var_r + beta**2 * var_k + 2 * beta * cov, 0.0) / samples
    bias = _norm(expected - g[None])
    true_norm = float(_norm(g))
    return {
        "relative_bias": bias / true_norm,
        "variance": var,
        "mse": bias**2 + var,
        "cosine": cosine(expected, g),
        "relative_rmse": np.sqrt(bias**2 + var) / true_norm,
    }
