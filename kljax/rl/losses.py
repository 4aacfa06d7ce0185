"""The policy-gradient surrogate with PPO-style clipping, per token. How tokens and sequences are
weighed and summed into the loss is the objective's (`kljax.rl.objective`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kljax.rl.estimators import as_float
from kljax.rl.kl import masked

Array = jax.Array


def policy_loss(
    logp_bt: Array,
    sampler_logp_bt: Array,
    advantages_bt: Array,
    mask_bt: Array,
    clip_low: float | None = 0.2,
    clip_high: float | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[Array, Array]:
    """Per-token clipped REINFORCE / PPO surrogate to *minimize*, and which tokens were clipped.

    ratio_t = exp(log pi_theta(y_t|h_t) - stop_grad(log mu(y_t|h_t))), A_t = advantages_bt;
        loss_t = -min(ratio_t * A_t, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_t).
    clip_high defaults to clip_low (symmetric); clip_low=None disables clipping (plain importance-
    weighted REINFORCE; on-policy its gradient is -A_t grad log pi). Shapes [B, T] -> ([B, T], [B, T]);
    masked tokens give 0.
    clip_ratio_c (dual-clip PPO, verl's actor.clip_ratio_c, > 1): where A_t < 0 the loss is further
    capped at -A_t * clip_ratio_c, so a token with ratio above clip_ratio_c and a negative
    advantage has no gradient (counted as clipped). Inactive on-policy (ratio 1).
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
    if clip_ratio_c is not None:
        if not clip_ratio_c > 1:
            raise ValueError(f"rl.clip_ratio_c={clip_ratio_c} must be > 1 (or None for no dual clip)")
        floor = clip_ratio_c * adv  # the loss -surrogate is capped at -clip_ratio_c * A where A < 0
        dual = (adv < 0) & (surrogate < floor)
        surrogate = jnp.where(dual, floor, surrogate)
        clipped = jnp.maximum(clipped, dual.astype(clipped.dtype))
    return -surrogate * mask, clipped * mask
