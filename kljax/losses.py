"""Policy-gradient surrogates with PPO-style clipping, and loss aggregation as (sum, denominator).

Aggregation returns a (sum, denominator) pair instead of a mean so that gradient accumulation over
micro-batches and reductions over hosts can take a true global mean: sum the sums, sum the
denominators, divide once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kljax.estimators import as_float
from kljax.kl import masked

Array = jax.Array

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def policy_loss(
    logp_bt: Array,
    sampler_logp_bt: Array,
    advantages_bt: Array,
    mask_bt: Array,
    clip_low: float | None = 0.2,
    clip_high: float | None = None,
) -> tuple[Array, Array]:
    """Per-token clipped REINFORCE / PPO surrogate to *minimize*, and which tokens were clipped.

    ratio_t = exp(log pi_theta(y_t|h_t) - stop_grad(log mu(y_t|h_t))), A_t = advantages_bt;
        loss_t = -min(ratio_t * A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_t).
    clip_high defaults to clip_low (symmetric); clip_low=None disables clipping (plain importance-
    weighted REINFORCE; on-policy its gradient is -A_t grad log pi). Shapes [B, T] -> ([B, T], [B, T]);
    masked tokens give 0.
    """
    mask = as_float(mask_bt)
    logp = masked(logp_bt, mask)
    ratio = jnp.exp(logp - jax.lax.stop_gradient(masked(sampler_logp_bt, mask)))
    adv = as_float(jax.lax.stop_gradient(advantages_bt))
    unclipped = ratio * adv
    if clip_low is None:
        surrogate, clipped = unclipped, jnp.zeros_like(unclipped)
    else:
        high = clip_low if clip_high is None else clip_high
        if clip_low < 0 or high < 0:
            raise ValueError(f"clip epsilons must be >= 0, got clip_low={clip_low}, clip_high={high}")
        clipped_obj = jnp.clip(ratio, 1.0 - clip_low, 1.0 + high) * adv
        surrogate = jnp.minimum(unclipped, clipped_obj)
        clipped = (clipped_obj < unclipped).astype(unclipped.dtype)
    return -surrogate * mask, clipped * mask


def aggregate(values_bt: Array, mask_bt: Array, mode: str, max_len: int | None = None) -> tuple[Array, Array]:
    """Reduce per-token values to (sum, denominator); the loss is sum / denominator.

    token-mean:              sum_bt v m / sum_bt m               (each token weighs the same; GRPO/DAPO)
    seq-mean-token-mean:     sum_b (sum_t v m / sum_t m) / B     (each sequence weighs the same)
    seq-mean-token-sum:      sum_bt v m / B                      (sum over tokens: the objective E[sum_t .])
    seq-mean-token-sum-norm: sum_bt v m / max_len / B            (Dr. GRPO: a constant length normalizer)
    max_len defaults to T. Empty sequences count 0 in seq-mean-token-mean.
    """
    mask = as_float(mask_bt)
    v = masked(values_bt, mask)
    n_seq = jnp.asarray(v.shape[0], v.dtype)
    if mode == "token-mean":
        return jnp.sum(v), jnp.sum(mask)
    if mode == "seq-mean-token-mean":
        per_seq = jnp.sum(v, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        return jnp.sum(per_seq), n_seq
    if mode == "seq-mean-token-sum":
        return jnp.sum(v), n_seq
    if mode == "seq-mean-token-sum-norm":
        length = v.shape[1] if max_len is None else max_len
        if length <= 0:
            raise ValueError(f"max_len must be positive, got {length}")
        return jnp.sum(v) / length, n_seq
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {list(AGGREGATIONS)}")


def safe_divide(total: Array, denominator: Array) -> Array:
    """total / denominator, 0 where the denominator is 0 (an all-padding batch)."""
    return jnp.where(denominator > 0, total / jnp.where(denominator > 0, denominator, 1.0), 0.0)
