"""The RL objective: advantages (reward-placed KL folded in), the clipped surrogate, the loss-placed KL term.

With sequence b's per-token policy loss pg_bt (clipped surrogate of the advantages A_bt) and its differentiable
KL loss term kl_b (`kljax.rl.kl.kl_terms`), the loss minimized is
    loss = sum_b w_b * (sum_t pg_bt + beta * kl_b) / D
where the aggregation fixes the per-sequence weight w_b and the batch denominator D once, for every term (so
`beta` weighs the reward-placed and the loss-placed KL the same way):
    aggregation               w_b          D                 E[gradient]
    seq-mean-token-sum-norm   1            B * R             grad(-J) / R       (R = response buffer)
    seq-mean-token-sum        1            B                 grad(-J)
    seq-mean-token-mean       1 / L_b      B                 length-weighted: biased when L_b varies
    token-mean                1            sum_b L_b         length-weighted: biased when L_b varies
(L_b: sequence b's response tokens; J = E[R] - beta KL_seq; on-policy, RLOO: `kljax.verdicts.objective`). D is
a property of the whole batch, so accumulating micro-batch gradients of `loss_sum / D` is exact.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kljax.rl import advantages as adv
from kljax.rl import losses
from kljax.rl.estimators import as_float
from kljax.rl.kl import KLConfig, KLTerms, kl_terms, masked

Array = jax.Array

DEFAULT_AGGREGATION = "seq-mean-token-sum-norm"
AGGREGATIONS = ("seq-mean-token-sum-norm", "seq-mean-token-sum", "seq-mean-token-mean", "token-mean")
CONSTANT_AGGREGATIONS = ("seq-mean-token-sum-norm", "seq-mean-token-sum")


@dataclasses.dataclass(frozen=True)
class Objective:
    """The static settings of the loss: KL configuration, aggregation and PPO clipping (clip_ratio_c:
    dual-clip, `kljax.rl.losses.policy_loss`)."""

    kl: KLConfig
    aggregation: str = DEFAULT_AGGREGATION
    clip_low: float | None = 0.2
    clip_high: float | None = None
    clip_ratio_c: float | None = None

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation)


def check_aggregation(name: str) -> None:
    """Raise ValueError naming the bad aggregation and the valid ones."""
    if name not in AGGREGATIONS:
        raise ValueError(f"rl.loss_aggregation={name!r} is not valid; choose one of {list(AGGREGATIONS)}")


def sequence_weights(mask_br: Array, aggregation: str) -> Array:
    """w_b [B] of the aggregation (see module doc); depends on sequence b alone."""
    check_aggregation(aggregation)
    mask = as_float(mask_br)
    if aggregation == "seq-mean-token-mean":
        return 1.0 / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
    return jnp.ones(mask.shape[:1], mask.dtype)


def denominator(mask_br: Array, aggregation: str) -> Array:
    """D, the scalar every term of the whole batch [B, R] is divided by (see module doc)."""
    check_aggregation(aggregation)
    mask = as_float(mask_br)
    b, r = mask.shape
    if aggregation == "token-mean":
        return jnp.maximum(jnp.sum(mask), 1.0)
    if aggregation == "seq-mean-token-sum-norm":
        return jnp.asarray(b * r, mask.dtype)
    return jnp.asarray(b, mask.dtype)


@dataclasses.dataclass(frozen=True)
class TokenLogProbs:
    """Per response token [B, R]: the policy's log-probs, the reference's, the response mask, and
    optionally the sampler's (off-policy) and the full-vocabulary KL of each position ('full')."""

    logp_br: Array
    ref_logp_br: Array
    mask_br: Array
    sampler_logp_br: Array | None = None
    full_kl_br: Array | None = None


def advantages_with_kl(kl: KLConfig, baseline: adv.Baseline, task_rewards_b: Array, logps: TokenLogProbs,
                       beta: float | Array) -> Array:
    """Token advantages [B, R] (detached): the task reward minus beta times the reward-placed KL
    (credit applied), minus the group baseline, over the group scale (`kljax.rl.advantages`; the KL
    after them when kl.in_baseline is False)."""
    terms = kl_terms(kl, logps.logp_br, logps.ref_logp_br, logps.mask_br, logps.sampler_logp_br, logps.full_kl_br)
    return jax.lax.stop_gradient(
        adv.token_advantages(task_rewards_b, terms.penalty_bt, terms.penalty_b, beta, baseline.group_size,
                             baseline.method, baseline.std_eps, kl.in_baseline, baseline.scale)
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LossParts:
    """The weighted sums of one (micro-)batch, before dividing by D.

    loss_sum = pg_sum + beta * kl_sum; clipped_bt [B, R] marks the tokens the surrogate clipped."""

    loss_sum: Array
    pg_sum: Array
    kl_sum: Array
    clipped_bt: Array


def sequence_losses(
    objective: Objective, logp_br: Array, sampler_logp_br: Array, ref_logp_br: Array, advantages_br: Array,
    mask_br: Array, beta: float | Array, full_kl_br: Array | None = None,
) -> tuple[Array, Array, Array]:
    """Per-sequence (pg_b, kl_b, clipped_bt): pg_b = sum_t pg_bt, the clipped surrogate of the
    advantages; kl_b the differentiable KL loss term (`kl_terms(...).loss_b`). logp_br
    differentiable, [B, R] float32 (or wider); the sampler's and the reference's log-probs and the
    advantages are detached. `beta` is unused here (kept for a uniform signature)."""
    del beta
    mask = as_float(mask_br)
    pg_bt, clipped_bt = losses.policy_loss(
        logp_br, sampler_logp_br, advantages_br, mask, objective.clip_low, objective.clip_high, objective.clip_ratio_c
    )
    terms: KLTerms = kl_terms(objective.kl, logp_br, ref_logp_br, mask, sampler_logp_br, full_kl_br)
    return jnp.sum(pg_bt, axis=1), terms.loss_b, clipped_bt


def loss_parts(
    objective: Objective, logp_br: Array, sampler_logp_br: Array, ref_logp_br: Array, advantages_br: Array,
    mask_br: Array, beta: Array, full_kl_br: Array | None = None,
) -> LossParts:
    """sum_b w_b (sum_t pg_bt + beta kl_b) for a (micro-)batch (see `sequence_losses`)."""
    pg_b, kl_b, clipped_bt = sequence_losses(objective, logp_br, sampler_logp_br, ref_logp_br, advantages_br,
                                             mask_br, beta, full_kl_br)
    w_b = sequence_weights(mask_br, objective.aggregation)
    pg_sum, kl_sum = jnp.sum(w_b * pg_b), jnp.sum(w_b * kl_b)
    return LossParts(pg_sum + beta * kl_sum, pg_sum, kl_sum, clipped_bt)


def kl_surrogate(
    config: KLConfig, logp_bt: Array, ref_logp_bt: Array, mask_bt: Array, sampler_logp_bt: Array | None = None,
    full_kl_bt: Array | None = None,
) -> Array:
    """Per-sequence scalar [B] whose gradient is this configuration's KL-gradient estimate (beta = 1,
    no task reward, no baseline, no clipping): the objective's `sequence_losses` with advantages
    -penalty_bt, i.e. sum_t w_t penalty_bt + loss_b with the token ratio w_t = pi_theta / mu through
    which the trainer applies the reward part. Its expectation over the sampler's sequences is what
    `kljax.verdicts.kl.describe` states and what tests/test_kl_exact.py enumerates."""
    logp = masked(logp_bt, mask_bt)
    sampler = jax.lax.stop_gradient(logp if sampler_logp_bt is None else masked(sampler_logp_bt, mask_bt))
    terms = kl_terms(config, logp_bt, ref_logp_bt, mask_bt, sampler_logp_bt, full_kl_bt)
    objective = Objective(config, "seq-mean-token-sum", clip_low=None)
    pg_b, kl_b, _ = sequence_losses(objective, logp, sampler, ref_logp_bt, -terms.penalty_bt, mask_bt, 1.0,
                                    full_kl_bt)
    return pg_b + kl_b


def rl_loss(objective: Objective, baseline: adv.Baseline, task_rewards_b: Array, logps: TokenLogProbs,
            beta: float | Array, rollout_logp_br: Array | None = None) -> Array:
    """The whole loss of one batch, as the trainer takes it: advantages (detached) from the policy's
    log-probs when the batch was built, `rollout_logp_br` (the rollout computes the reward-placed KL
    then, once per batch; default: logps.logp_br's current value, the first update on a fresh batch),
    then `loss_parts` / D. logps.sampler_logp_br is required (the sampler's log-probs). Scalar."""
    rollout = logps.logp_br if rollout_logp_br is None else rollout_logp_br
    full = None if logps.full_kl_br is None else jax.lax.stop_gradient(logps.full_kl_br)
    detached = dataclasses.replace(logps, logp_br=jax.lax.stop_gradient(rollout), full_kl_br=full)
    a = advantages_with_kl(objective.kl, baseline, task_rewards_b, detached, beta)
    parts = loss_parts(objective, logps.logp_br, logps.sampler_logp_br, logps.ref_logp_br, a, logps.mask_br,
                       jnp.asarray(beta), logps.full_kl_br)
    return parts.loss_sum / denominator(logps.mask_br, objective.aggregation)
