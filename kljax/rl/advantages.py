"""Group baselines for policy gradients: RLOO, GRPO, Dr. GRPO.

Rewards come in groups of G samples per prompt, laid out contiguously: [P * G] with the samples of
prompt p at p*G .. p*G + G - 1. Each method gives a per-sample baseline b_i that does not depend on
sample i's own response (RLOO) or only through the group (GRPO, Dr. GRPO), and a scale s_i:
    A_i = (R_i - b_i) / s_i.
For token-level returns (KL reward-to-go credit) the same baseline and scale apply to every token:
    A_it = (R_it - b_i) / s_i,  with b and s computed from the sequence returns R_i.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

METHODS = ("rloo", "grpo", "dr_grpo")
MIN_GROUP = {"rloo": 2, "grpo": 2, "dr_grpo": 1}


def _groups(rewards_b: Array, group_size: int) -> Array:
    n = rewards_b.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"batch of {n} rewards is not a whole number of groups of size {group_size}")
    return jnp.asarray(rewards_b, jnp.promote_types(rewards_b.dtype, jnp.float32)).reshape(-1, group_size)


def baseline_and_scale(
    rewards_b: Array, group_size: int, method: str = "rloo", eps: float = 1e-6
) -> tuple[Array, Array]:
    """Per-sample (baseline [B], scale [B]).

    rloo:    b_i = mean of the other G-1 rewards of the group; s_i = 1 (unbiased: b_i is independent of y_i).
    grpo:    b_i = group mean; s_i = group std (ddof=1, as TRL) + eps. A group of equal rewards gives A = 0.
    dr_grpo: b_i = group mean; s_i = 1 (no std normalization; use loss aggregation
             'seq-mean-token-sum-norm' for its constant length normalizer).
    """
    if method not in METHODS:
        raise ValueError(f"unknown advantage method {method!r}; choose one of {list(METHODS)}")
    if group_size < MIN_GROUP[method]:
        raise ValueError(f"advantage method {method!r} needs group_size >= {MIN_GROUP[method]}, got {group_size}")
    r_pg = _groups(rewards_b, group_size)
    mean_pg = jnp.broadcast_to(jnp.mean(r_pg, axis=1, keepdims=True), r_pg.shape)
    ones = jnp.ones_like(r_pg)
    if method == "rloo":
        baseline = (jnp.sum(r_pg, axis=1, keepdims=True) - r_pg) / (group_size - 1)
        return baseline.reshape(-1), ones.reshape(-1)
    if method == "grpo":
        std = jnp.std(r_pg, axis=1, keepdims=True, ddof=1)
        return mean_pg.reshape(-1), jnp.broadcast_to(std + eps, r_pg.shape).reshape(-1)
    return mean_pg.reshape(-1), ones.reshape(-1)


def advantages(rewards_b: Array, group_size: int, method: str = "rloo", eps: float = 1e-6) -> Array:
    """Sequence-level advantages (R_i - b_i) / s_i, [B]."""
    baseline, scale = baseline_and_scale(rewards_b, group_size, method, eps)
    return (_groups(rewards_b, group_size).reshape(-1) - baseline) / scale


def token_advantages(
    task_rewards_b: Array,
    penalty_bt: Array,
    penalty_b: Array,
    beta: float | Array,
    group_size: int,
    method: str = "rloo",
    eps: float = 1e-6,
) -> Array:
    """Token-level advantages with the KL reward penalty folded in, [B, T].

    Sequence returns R_i = task_i - beta * penalty_b_i set the baseline and scale; token t's return
    is task_i - beta * penalty_bt[i, t] (equal to R_i under sequence credit; the reward-to-go under
    reward_to_go credit). Baselines never depend on sample i's own tokens under RLOO, so the KL
    part's gradient stays unbiased.
    """
    returns_b = task_rewards_b - beta * penalty_b
    baseline, scale = baseline_and_scale(returns_b, group_size, method, eps)
    token_returns = task_rewards_b[:, None] - beta * penalty_bt
    return (token_returns - baseline[:, None]) / scale[:, None]
