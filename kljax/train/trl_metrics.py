"""The metrics TRL's GRPOTrainer logs (TRL 1.16), under its names and as it computes them.

Rollout, over the step's B = prompts x G completions (group i: rows i*G .. i*G + G - 1), on the host:
    reward, reward_std         mean and std (Bessel, n - 1) of the B total rewards: one std over the
                               whole batch, not a mean of the groups' stds (TRL's nanstd(rewards))
    frac_reward_zero_std       fraction of groups whose rewards have std <= 1e-8 (all equal; G = 1: 1)
    rewards/NAME/mean, /std    one reward function's unweighted scores; NaN (None: no score) left out
    completions/{mean,min,max}_length             tokens per completion, the stop token included
    completions/clipped_ratio                     fraction that ended without a stop (cut at the limit)
    completions/{mean,min,max}_terminated_length  over the completions that stopped (0 when none did)
Train step, at the update's forward: `step_sums` per micro-batch, `step_means` of their totals:
    kl                     token mean of k3 = exp(ref - logp) - (ref - logp) - 1
    clip_ratio/low_mean    token mean of [ratio < 1 - clip_low and A < 0]; high: ratio > 1 + clip_high
                           and A > 0; region: either; ratio = pi / mu of the sampled token
    clip_ratio/low_min, /high_max   min / max over sequences of their own token mean of it
Token means are over the loss mask (`Batch.response_mask_br`), which is TRL's completion mask.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.parallel.distributed import gather, global_from_local_rows
from kljax.parallel.sharding import data_sharding
from kljax.rl.estimators import k3

Array = jax.Array
ZERO_STD = 1e-8  # torch.isclose(std, 0)'s absolute tolerance, TRL's test of a zero-std group


def nanstd(x: Any) -> float:
    """Sample std (n - 1) of the non-NaN values of `x`; NaN with fewer than two (TRL's nanstd)."""
    values = np.asarray(x, np.float64).ravel()
    values = values[~np.isnan(values)]
    return float(np.std(values, ddof=1)) if values.size > 1 else math.nan


def nanmean(x: Any) -> float:
    """Mean of the non-NaN values of `x`; NaN when there are none."""
    values = np.asarray(x, np.float64).ravel()
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def reward_metrics(rewards_b: Any, group_size: int) -> dict[str, float]:
    """reward, reward_std, frac_reward_zero_std of the total rewards [B] (B a multiple of group_size)."""
    rewards_b = np.asarray(rewards_b, np.float64)
    groups_ng = rewards_b.reshape(-1, group_size)
    if group_size > 1:
        zero_n = np.array([nanstd(g) <= ZERO_STD for g in groups_ng])  # a NaN std (one score) is not zero
    else:  # TRL sets the std of one-sample groups to 0
        zero_n = np.ones(groups_ng.shape[0], bool)
    return {"reward": nanmean(rewards_b), "reward_std": nanstd(rewards_b),
            "frac_reward_zero_std": float(zero_n.mean()) if zero_n.size else math.nan}


def function_metrics(name: str, scores_b: Any) -> dict[str, float]:
    """rewards/NAME/mean and rewards/NAME/std of one function's scores [B] (NaN: no score)."""
    return {f"rewards/{name}/mean": nanmean(scores_b), f"rewards/{name}/std": nanstd(scores_b)}


def completion_metrics(lengths_b: Any, stopped_b: Any) -> dict[str, float]:
    """completions/* of the completions' token counts [B] and whether each ended with a stop [B]."""
    lengths_b = np.asarray(lengths_b, np.float64)
    stopped_b = np.asarray(stopped_b, bool)
    ended = lengths_b[stopped_b] if stopped_b.any() else np.zeros(1)
    return {
        "completions/mean_length": float(lengths_b.mean()), "completions/min_length": float(lengths_b.min()),
        "completions/max_length": float(lengths_b.max()),
        "completions/clipped_ratio": float(np.mean(~stopped_b)),
        "completions/mean_terminated_length": float(ended.mean()),
        "completions/min_terminated_length": float(ended.min()),
        "completions/max_terminated_length": float(ended.max()),
    }


# ------------------------------------------------------------------------------------------------- step

STEP_SUMS_INIT = {"trl_kl_sum": 0.0, "trl_low_sum": 0.0, "trl_high_sum": 0.0, "trl_region_sum": 0.0,
                  "trl_low_min": math.inf, "trl_high_max": -math.inf}  # *_min / *_max combine by min / max


def step_sums(logp_br: Array, sampler_logp_br: Array, ref_logp_br: Array, advantages_br: Array, mask_br: Array,
              clip_low: float | None, clip_high: float | None) -> dict[str, Array]:
    """The STEP_SUMS_INIT keys of one micro-batch: token sums of k3 and the clip indicators, and the
    min / max over its sequences (with a response token) of their low / high fractions.
    clip_high None: clip_low; clip_low None (no clipping): nothing is clipped. Shapes [B, R]."""
    on_br = mask_br > 0
    m_br = on_br.astype(jnp.float32)
    logp = jnp.where(on_br, logp_br.astype(jnp.float32), 0.0)
    d_br = logp - jnp.where(on_br, ref_logp_br.astype(jnp.float32), 0.0)
    if clip_low is None:
        low_br = high_br = jnp.zeros_like(on_br)
    else:
        ratio_br = jnp.exp(logp - jnp.where(on_br, sampler_logp_br.astype(jnp.float32), 0.0))
        high = clip_low if clip_high is None else clip_high
        low_br = (ratio_br < 1.0 - clip_low) & (advantages_br < 0) & on_br
        high_br = (ratio_br > 1.0 + high) & (advantages_br > 0) & on_br
    n_b = jnp.sum(m_br, axis=1)
    has_b = n_b > 0
    low_b = jnp.sum(low_br, axis=1) / jnp.maximum(n_b, 1.0)
    high_b = jnp.sum(high_br, axis=1) / jnp.maximum(n_b, 1.0)
    return {
        "trl_kl_sum": jnp.sum(jnp.where(on_br, k3(d_br), 0.0)),
        "trl_low_sum": jnp.sum(low_br.astype(jnp.float32)),
        "trl_high_sum": jnp.sum(high_br.astype(jnp.float32)),
        "trl_region_sum": jnp.sum((low_br | high_br).astype(jnp.float32)),
        "trl_low_min": jnp.min(jnp.where(has_b, low_b, jnp.inf)),
        "trl_high_max": jnp.max(jnp.where(has_b, high_b, -jnp.inf)),
    }


def step_means(sums: Mapping[str, Array], mask_br: Array) -> dict[str, Array]:
    """kl and clip_ratio/* from the whole batch's `step_sums` (NaN min / max when no sequence has a token)."""
    n = jnp.maximum(jnp.sum(mask_br.astype(jnp.float32)), 1.0)
    finite = lambda x: jnp.where(jnp.isfinite(x), x, jnp.nan)
    return {
        "kl": sums["trl_kl_sum"] / n,
        "clip_ratio/low_mean": sums["trl_low_sum"] / n,
        "clip_ratio/low_min": finite(sums["trl_low_min"]),
        "clip_ratio/high_mean": sums["trl_high_sum"] / n,
        "clip_ratio/high_max": finite(sums["trl_high_max"]),
        "clip_ratio/region_mean": sums["trl_region_sum"] / n,
    }


# ---------------------------------------------------------------------------------------------- rollout


@functools.partial(jax.jit, static_argnums=1)
def _token_counts(mask_bs: Array, response_len: int) -> tuple[Array, Array]:
    """(prompt tokens [B], completion tokens [B]) of the sequences' mask (response: the last positions)."""
    m = mask_bs.astype(jnp.int32)
    return jnp.sum(m[:, : m.shape[1] - response_len], axis=1), jnp.sum(m[:, m.shape[1] - response_len:], axis=1)


def _global_rows(values: Any, rows: Any, num_rows: int, mesh: Any) -> np.ndarray:
    """[num_rows, ...] of every process's `values` at its global `rows` (one process: its own)."""
    values = np.asarray(values)
    if jax.process_count() == 1 or mesh is None:
        out = np.full((num_rows, *values.shape[1:]), np.nan, np.float64)
        out[np.arange(num_rows) if rows is None else np.asarray(rows)] = values
        return out
    return gather(global_from_local_rows(values, np.asarray(rows), num_rows, data_sharding(mesh, 1)))


def rollout_metrics(info: Any, batch: Any, group_size: int, mesh: Any = None) -> tuple[dict[str, float], int]:
    """(TRL's rollout metrics, the step's prompt + completion tokens) of a rollout's `RolloutInfo` and
    `Batch` (every process calls it together in a multi-host run; rows are gathered)."""
    b = batch.mask_bs.shape[0]
    rewards_b = _global_rows(info.rewards, info.rows, b, mesh)
    out = reward_metrics(rewards_b, group_size)
    for name, scores in info.reward_parts.items():
        out.update(function_metrics(name, _global_rows(scores, info.rows, b, mesh)))
    prompt_b, completion_b = gather(_token_counts(batch.mask_bs, batch.response_mask_br.shape[1]))
    if getattr(info, "stopped", None) is not None:
        out.update(completion_metrics(completion_b, gather(info.stopped)))
    return out, int(np.sum(prompt_b) + np.sum(completion_b))


def trl_kl_logged(beta: float, placement: str) -> bool:
    """Whether TRL would log `kl`: it does when its beta is not 0 (a KL term in the objective)."""
    return beta != 0 and placement != "none"



def resumed_num_tokens(meta: Mapping[str, Any], rows: Any, step: int) -> float:
    """num_tokens after `step` for a resumed run: its checkpoint's meta, else the metrics row of that
    step (a checkpoint written before kljax kept it there), else NaN (unknown: logged as null)."""
    if isinstance(meta.get("num_tokens"), (int, float)):
        return float(meta["num_tokens"])
    known = [r["num_tokens"] for r in rows if r.get("step") == step and isinstance(r.get("num_tokens"), (int, float))]
    return float(known[-1]) if known else math.nan
