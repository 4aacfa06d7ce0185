"""Group baselines for policy gradients: RLOO, GRPO, Dr. GRPO.

Rewards come in groups of G samples per prompt, laid out contiguously: [P * G] with the samples of
prompt p at p*G .. p*G + G - 1. Each method gives a per-sample baseline b_i that does not depend on
sample i's own response (RLOO) or only through the group (GRPO, Dr. GRPO), and a scale s_i:
    A_i = (R_i - b_i) / s_i.
For token-level returns (KL reward-to-go credit) the same baseline and scale apply to every token:
    A_it = (R_it - b_i) / s_i,  with b and s computed from the sequence returns R_i.
GRPO gives every token of a group whose sequence returns are all equal A = 0, whatever the credit
(its std is 0: dividing the reward-to-go's past terms by eps alone would blow them up).
With the reward-placed KL outside the baseline (`kl.in_baseline=False`, OpenRLHF's placement) the
baseline and scale see the task reward alone and the per-token KL is added after them, unscaled:
    A_it = (task_i - b_i) / s_i - beta * penalty_it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array

METHODS = ("rloo", "grpo", "dr_grpo")
MIN_GROUP = {"rloo": 2, "grpo": 2, "dr_grpo": 1}
SCALES = ("group", "batch")  # grpo's std: of the sample's group, or of the whole batch (TRL's scale_rewards)
DEFAULT_STD_EPS = 1e-4  # grpo's s_i = std + eps: TRL's 1e-4 (verl uses 1e-6; `rl.advantage_std_eps`)


@dataclasses.dataclass(frozen=True)
class Baseline:
    """How returns become advantages: `method` (rloo, grpo, dr_grpo) over groups of `group_size`
    samples; grpo divides by the std of the group (`scale` "group") or of the whole batch ("batch",
    TRL's scale_rewards="batch"), plus `std_eps`."""

    method: str = "rloo"
    group_size: int = 4
    std_eps: float = DEFAULT_STD_EPS
    scale: str = "group"


def _groups(rewards_b: Array, group_size: int) -> Array:
    n = rewards_b.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(f"batch of {n} rewards is not a whole number of groups of size {group_size}")
    return jnp.asarray(rewards_b, jnp.promote_types(rewards_b.dtype, jnp.float32)).reshape(-1, group_size)


def baseline_and_scale(
    rewards_b: Array, group_size: int, method: str = "rloo", eps: float = DEFAULT_STD_EPS, scale: str = "group"
) -> tuple[Array, Array]:
    """Per-sample (baseline [B], scale [B]).

    rloo:    b_i = mean of the other G-1 rewards of the group; s_i = 1 (unbiased: b_i is independent of y_i).
    grpo:    b_i = group mean; s_i = group std (ddof=1, as TRL and verl) + eps (TRL: 1e-4, verl: 1e-6);
             with scale "batch" the std of the whole batch's rewards (TRL's scale_rewards="batch").
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
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; choose one of {list(SCALES)}")
    if method == "grpo":
        std = jnp.std(r_pg, axis=1, keepdims=True, ddof=1) if scale == "group" else jnp.std(r_pg, ddof=1)
        return mean_pg.reshape(-1), jnp.broadcast_to(std + eps, r_pg.shape).reshape(-1)
    return mean_pg.reshape(-1), ones.reshape(-1)


def equal_groups(rewards_b: Array, group_size: int) -> Array:
    """[B] bool: sample i's group has all rewards equal (then grpo's std is 0 and its A is 0)."""
    r_pg = _groups(rewards_b, group_size)
    equal_p = jnp.max(r_pg, axis=1) == jnp.min(r_pg, axis=1)
    return jnp.repeat(equal_p, group_size)


def advantages(rewards_b: Array, group_size: int, method: str = "rloo", eps: float = DEFAULT_STD_EPS,
               scale: str = "group") -> Array:
    """Sequence-level advantages (R_i - b_i) / s_i, [B]; 0 for grpo's groups of equal rewards."""
    baseline, s = baseline_and_scale(rewards_b, group_size, method, eps, scale)
    a = (_groups(rewards_b, group_size).reshape(-1) - baseline) / s
    return jnp.where(equal_groups(rewards_b, group_size), 0.0, a) if method == "grpo" else a


def token_advantages(
    task_rewards_b: Array,
    penalty_bt: Array,
    penalty_b: Array,
    beta: float | Array,
    group_size: int,
    method: str = "rloo",
    eps: float = DEFAULT_STD_EPS,
    kl_in_baseline: bool = True,
    scale: str = "group",
) -> Array:
    """Token-level advantages with the KL reward penalty folded in, [B, T].

    Sequence returns R_i = task_i - beta * penalty_b_i set the baseline and scale; token t's return
    is task_i - beta * penalty_bt[i, t] (equal to R_i under sequence credit; the reward-to-go under
    reward_to_go credit). Baselines never depend on sample i's own tokens under RLOO, so the KL
    part's gradient stays unbiased. grpo: a group of equal returns R_i gives A = 0 on every token.
    kl_in_baseline=False: A_it = advantages(task)_i - beta * penalty_bt[i, t] (see module doc).
    """
    if not kl_in_baseline:
        a_b = advantages(task_rewards_b, group_size, method, eps, scale)
        return a_b[:, None] - beta * penalty_bt
    returns_b = task_rewards_b - beta * penalty_b
    baseline, s = baseline_and_scale(returns_b, group_size, method, eps, scale)
    token_returns = task_rewards_b[:, None] - beta * penalty_bt
    a = (token_returns - baseline[:, None]) / s[:, None]
    return jnp.where(equal_groups(returns_b, group_size)[:, None], 0.0, a) if method == "grpo" else a
