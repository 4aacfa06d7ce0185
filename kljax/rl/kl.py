"""KL placements: a `KLConfig` plus per-token log-probs -> the pieces of the RL objective.

The objective is  J(theta) = E_{y~pi_theta}[ R(x, y) ] - beta * KL_seq(theta),
    KL_seq = E_{y~pi_theta}[ sum_t d_t ],   d_t = log pi_theta(y_t|h_t) - log pi_ref(y_t|h_t),
and its KL part must be estimated from samples. A `KLConfig` chooses the estimator (`kljax.rl.estimators`),
where the estimate enters (the reward: a score-function term; the loss: differentiated pathwise), the credit
and scope of the estimate, the off-policy correction, whether the reward part is in the baseline, and beta
(fixed, or adapted toward `target_kl` by `adapt_beta`); each field's comment says how.

`kl_terms` turns a config and log-probs into `KLTerms` (the detached reward penalty to subtract from returns,
and the differentiable loss term); the objective (`kljax.rl.objective`, whose `kl_surrogate` is the KL part
alone) composes them as the trainer differentiates them. `kljax.verdicts.kl.describe` (that module imports
this one, never the reverse) says what the KL part's gradient is in expectation. All of it is checked by
exact enumeration in tests/test_kl_exact.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from kljax.rl import estimators as est

Array = jax.Array

PLACEMENTS = ("none", "reward", "loss", "both")
CREDITS = ("sequence", "reward_to_go")
SCOPES = ("token", "sequence")
OFF_POLICY = ("none", "token_ratio", "sequence_weight")


class KLBiasWarning(UserWarning):
    """A run is configured with a KL configuration that is biased or regularizes nothing."""


@dataclasses.dataclass(frozen=True)
class KLConfig:
    """How the KL regularizer is estimated and where it enters the objective (module doc; field comments)."""

    # k1, k2, k3, k3+ (straight-through: k3 value, k2 gradient) or full (exact per-prefix KL from both
    # models' logits), see `kljax.rl.estimators`
    estimator: str = "k1"
    # "reward": beta * stop_grad(k) is subtracted from the return before the baseline, so it reaches the
    # gradient only through the score function E[(sum_t k_t) grad log pi(y|x)]; "loss": beta * sum_t k_t is
    # added to the loss and differentiated with the samples fixed (pathwise E[sum_t grad k_t]); "both": full
    # beta in each; "none": no KL term
    placement: str = "reward"
    # of the reward part: "sequence" (every token's return loses the whole sum) or "reward_to_go" (token t
    # loses sum_{s>=t} k_s; for "full", sum_{s>t} KL_s since KL_t(h_t) does not depend on y_t); past terms
    # have zero mean, so this only removes variance
    credit: str = "sequence"
    # "token" applies the estimator to each d_t; "sequence" applies it once to D = sum_t d_t (so k2
    # sequence-level is D**2/2, whose pathwise gradient is D grad log pi(y|x) = grad KL_seq)
    scope: str = "token"
    # samples from a sampler mu != pi_theta: "none"; "token_ratio" multiplies each loss token by
    # w_t = pi_theta(y_t|h_t)/mu(y_t|h_t) (differentiable numerator); "sequence_weight" multiplies every KL
    # term by W = stop_grad(prod_t w_t), optionally truncated at `truncation`, and then carries the reward
    # part as its own score-function loss term (W * sum_t log pi_t * credit_t) instead of in the advantage
    off_policy: str = "none"
    truncation: float | None = None
    beta: float = 0.05
    target_kl: float | None = None  # adapt beta toward it (`adapt_beta`); None: beta fixed
    adapt_horizon: float = 10_000.0
    # of the reward part: True folds it into the return the group baseline and scale are computed from;
    # False subtracts it after them, unscaled (OpenRLHF's placement; see `kljax.rl.advantages`). Same
    # expected KL gradient under RLOO; with a group-mean baseline the task reward then carries (G-1)/G, the KL 1
    in_baseline: bool = True

    def __post_init__(self) -> None:
        validate(self)

    @property
    def in_reward(self) -> bool:
        return self.placement in ("reward", "both")

    @property
    def in_loss(self) -> bool:
        return self.placement in ("loss", "both")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> KLConfig:
        """Build from a mapping of its fields; unknown fields are an error."""
        values = dict(values)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown kl config field(s) {unknown}; valid fields: {sorted(names)}")
        return cls(**values)

    def replace(self, **changes: Any) -> KLConfig:
        return dataclasses.replace(self, **changes)


def _choice(field: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"kl.{field}={value!r} is not valid; choose one of {list(valid)}")


def validate(c: KLConfig) -> None:
    """Raise ValueError naming the field and the valid choices for an invalid configuration."""
    _choice("estimator", c.estimator, est.ESTIMATOR_NAMES)
    _choice("placement", c.placement, PLACEMENTS)
    _choice("credit", c.credit, CREDITS)
    _choice("scope", c.scope, SCOPES)
    _choice("off_policy", c.off_policy, OFF_POLICY)
    if not isinstance(c.beta, (int, float)) or not (c.beta >= 0 and math.isfinite(c.beta)):
        raise ValueError(f"kl.beta={c.beta!r} must be a finite number >= 0")
    for name in ("target_kl", "truncation"):
        value = getattr(c, name)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"kl.{name}={value!r} must be a finite number > 0 (or None)")
    if not (isinstance(c.adapt_horizon, (int, float)) and math.isfinite(c.adapt_horizon) and c.adapt_horizon > 0):
        raise ValueError(f"kl.adapt_horizon={c.adapt_horizon!r} must be a finite number > 0")
    if c.credit == "reward_to_go" and not c.in_reward:
        raise ValueError(
            f"kl.credit='reward_to_go' assigns the reward part, but kl.placement={c.placement!r} has none; "
            "use placement 'reward' or 'both', or credit 'sequence'"
        )
    if c.scope == "sequence":
        if c.estimator == "full":
            raise ValueError("kl.scope='sequence' needs a sample estimator (k1, k2, k3, k3+), not 'full'")
        if c.credit == "reward_to_go":
            raise ValueError("kl.scope='sequence' gives one value per sequence: use kl.credit='sequence'")
        if c.off_policy == "token_ratio":
            raise ValueError("kl.off_policy='token_ratio' weights tokens: it needs kl.scope='token'")
    if c.off_policy == "token_ratio" and not c.in_loss:
        raise ValueError(
            "kl.off_policy='token_ratio' weights the loss term, but kl.placement="
            f"{c.placement!r} has none (the reward part already goes through the policy loss's token ratio)"
        )
    if c.truncation is not None:
        if c.off_policy != "sequence_weight":
            raise ValueError(
                f"kl.truncation={c.truncation!r} truncates the sequence importance weight: "
                "it needs kl.off_policy='sequence_weight'"
            )
        if not c.truncation > 1:
            raise ValueError(f"kl.truncation={c.truncation!r} must be > 1 (or None for no truncation)")
    if not isinstance(c.in_baseline, bool):
        raise ValueError(f"kl.in_baseline={c.in_baseline!r} must be true or false")
    if not c.in_baseline and (not c.in_reward or c.off_policy == "sequence_weight"):
        raise ValueError(
            "kl.in_baseline=False places the reward part of the KL after the advantage's baseline; it needs "
            f"kl.placement 'reward' or 'both' and kl.off_policy other than 'sequence_weight' (got "
            f"placement={c.placement!r}, off_policy={c.off_policy!r})"
        )
    if c.target_kl is not None and not c.target_kl > 0:
        raise ValueError(f"kl.target_kl={c.target_kl!r} must be > 0 (or None for a fixed beta)")
    if not c.adapt_horizon > 0:
        raise ValueError(f"kl.adapt_horizon={c.adapt_horizon!r} must be > 0")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KLTerms:
    """The KL pieces of the objective for one batch, before multiplying by beta.

    penalty_bt: [B, T] detached; token t's return is lowered by beta * penalty_bt (credit applied;
        zero on masked tokens). Zero when the reward part is not folded into the advantage.
    penalty_b:  [B] detached; the sequence total of the reward part (for group baselines).
    loss_b:     [B] differentiable; the per-sequence KL loss term (pathwise part, plus the
        importance-weighted score-function reward term under off_policy='sequence_weight').
    """

    penalty_bt: Array
    penalty_b: Array
    loss_b: Array


def masked(x_bt: Array, mask_bt: Array) -> Array:
    """x where mask is set, else 0, in at least float32; gradients never flow from masked entries."""
    x = est.as_float(x_bt)
    return jnp.where(jnp.asarray(mask_bt) > 0, x, jnp.zeros_like(x))


def _future_sum(x_bt: Array, include_current: bool) -> Array:
    """out[:, t] = sum_{s>=t} x[:, s] (or s > t)."""
    total = jnp.flip(jnp.cumsum(jnp.flip(x_bt, axis=1), axis=1), axis=1)
    return total if include_current else total - x_bt


def kl_terms(
    config: KLConfig,
    logp_bt: Array,
    ref_logp_bt: Array,
    mask_bt: Array,
    sampler_logp_bt: Array | None = None,
    full_kl_bt: Array | None = None,
) -> KLTerms:
    """Turn per-token log-probs of the sampled tokens into the configuration's KL pieces.

    logp_bt: [B, T] log pi_theta(y_t|h_t), differentiable. ref_logp_bt: [B, T] log pi_ref (frozen).
    mask_bt: [B, T] 1 for response tokens. sampler_logp_bt: [B, T] log mu(y_t|h_t) of the policy
    that sampled y (None: on-policy, mu = pi_theta). full_kl_bt: [B, T] differentiable
    KL(pi_theta(.|h_t) || pi_ref(.|h_t)), required for estimator 'full' (`estimators.full_kl_from_logits`).
    """
    mask = est.as_float(mask_bt)
    # Padding may hold garbage (-inf log-probs): select it away before any arithmetic, so that
    # neither values nor gradients see it (multiplying by the mask would give 0 * inf = nan).
    logp = masked(logp_bt, mask)
    sampler_logp = jax.lax.stop_gradient(logp if sampler_logp_bt is None else masked(sampler_logp_bt, mask))
    d_bt = logp - masked(ref_logp_bt, mask)
    batch = logp.shape[0]
    zeros_b = jnp.zeros((batch,), logp.dtype)
    if config.placement == "none":
        return KLTerms(jnp.zeros_like(logp), zeros_b, zeros_b)

    k_bt = None  # per-token estimates; None under scope 'sequence'
    if config.estimator == "full":
        if full_kl_bt is None:
            raise ValueError("kl.estimator='full' needs full_kl_bt (the per-prefix KL from both models' logits)")
        k_bt = masked(full_kl_bt, mask)
    elif config.scope == "token":
        k_bt = est.sample_estimator(config.estimator)(d_bt) * mask
    if config.scope == "sequence":
        k_b = est.sample_estimator(config.estimator)(jnp.sum(d_bt, axis=1))
    else:
        k_b = jnp.sum(k_bt, axis=1)

    # Reward part: detached, credit-assigned.
    penalty_b, penalty_bt = zeros_b, jnp.zeros_like(logp)
    if config.in_reward:
        penalty_b = jax.lax.stop_gradient(k_b)
        if config.credit == "reward_to_go":
            future = _future_sum(jax.lax.stop_gradient(k_bt), include_current=config.estimator != "full")
            penalty_bt = future * mask
        else:
            penalty_bt = penalty_b[:, None] * mask

    # Loss part: differentiable.
    loss_b = zeros_b
    if config.in_loss:
        if config.off_policy == "token_ratio":
            ratio_bt = jnp.exp(logp - sampler_logp) * mask
            loss_b = jnp.sum(ratio_bt * k_bt, axis=1)
        else:
            loss_b = k_b

    if config.off_policy == "sequence_weight":
        weight_b = sequence_weight(logp, sampler_logp, mask, config.truncation)
        score_b = jnp.sum(logp * mask * penalty_bt, axis=1)
        loss_b = weight_b * (loss_b + score_b)
        penalty_bt, penalty_b = jnp.zeros_like(penalty_bt), zeros_b
    return KLTerms(penalty_bt=penalty_bt, penalty_b=penalty_b, loss_b=loss_b)


def sequence_weight(
    logp_bt: Array, sampler_logp_bt: Array, mask_bt: Array, truncation: float | None = None
) -> Array:
    """W_b = stop_grad(prod_t pi_theta(y_t|h_t) / mu(y_t|h_t)), optionally min(W, truncation). [B]."""
    log_w = jnp.sum(masked(logp_bt, mask_bt) - masked(sampler_logp_bt, mask_bt), axis=1)
    w = jnp.exp(jax.lax.stop_gradient(log_w))
    return w if truncation is None else jnp.minimum(w, truncation)


KL_METRICS = ("k1", "k2", "k3", "kl_seq")


def kl_metric_sums(logp_bt: Array, ref_logp_bt: Array, mask_bt: Array) -> dict[str, Array]:
    """The sums behind `kl_metrics` (which add up over micro-batches): k1, k2, k3 summed over
    response tokens, and sum_t d_t summed over sequences."""
    mask = est.as_float(mask_bt)
    d = masked(logp_bt, mask) - masked(ref_logp_bt, mask)
    out = {name: jnp.sum(fn(d) * mask) for name, fn in (("k1", est.k1), ("k2", est.k2), ("k3", est.k3))}
    out["kl_seq"] = jnp.sum(d)
    return out


def kl_metrics(logp_bt: Array, ref_logp_bt: Array, mask_bt: Array) -> dict[str, Array]:
    """Monitoring values: per-token means of k1, k2, k3 over response tokens, and the mean
    sequence-level KL estimate sum_t d_t (unbiased for KL_seq on-policy)."""
    return kl_metrics_from_sums(kl_metric_sums(logp_bt, ref_logp_bt, mask_bt), mask_bt)


def kl_metrics_from_sums(sums: dict[str, Array], mask_bt: Array) -> dict[str, Array]:
    """`kl_metrics` from `kl_metric_sums` of the batch `mask_bt` (token means; kl_seq per sequence)."""
    n_tokens = jnp.maximum(jnp.sum(est.as_float(mask_bt)), 1.0)
    out = {name: sums[name] / n_tokens for name in ("k1", "k2", "k3")}
    out["kl_seq"] = sums["kl_seq"] / mask_bt.shape[0]
    return out


def adapt_beta(beta: float | Array, observed_kl: float | Array, config: KLConfig, n_steps: int = 1) -> Array:
    """Adaptive coefficient (Ziegler et al. 2019): beta <- beta * (1 + clip(KL/target - 1, +-0.2) * n/horizon).

    Returns beta unchanged when config.target_kl is None (fixed beta).
    """
    beta = jnp.asarray(beta, jnp.float32)
    if config.target_kl is None:
        return beta
    error = jnp.clip(jnp.asarray(observed_kl, jnp.float32) / config.target_kl - 1.0, -0.2, 0.2)
    return beta * (1.0 + error * n_steps / config.adapt_horizon)


__all__ = [
    "KLBiasWarning", "KLConfig", "KLTerms", "adapt_beta",
    "KL_METRICS", "kl_metric_sums", "kl_metrics", "kl_metrics_from_sums", "kl_terms", "masked",
    "sequence_weight", "validate",
]
