"""One rollout: prompts -> sampler (G samples each) -> rewards -> scores -> advantages -> a `Batch`.

    examples --prompt_texts--> token ids, left-padded to rl.max_prompt_len
             --sampling.generate (params of the sampler)--> responses, mask, sampler log-probs
             --tasks.score_batch--> task rewards, correctness
             --step.score (current params, reference params)--> log pi, log pi_ref, entropy (both at
               rl.temperature: the policy trained is the tempered one, `RLConfig.policy_temperature`)
               (log pi and entropy from the sampler instead when it drew from pi: `sampler_is_policy`)
             --kl_terms + token_advantages--> advantages with the KL reward penalty folded in

Multi-host: every process tokenizes the step's prompts (the same host data, so the prompt bucket
agrees) and the sampler places only each process's shards; each process then decodes and rewards
only the samples on its own devices (`kljax.parallel.distributed.local_rows`), and the rewards re-enter the
mesh as one global array built from those rows.

Prompt and response buffers have fixed sizes (rl.max_prompt_len, rl.max_new_tokens), so neither
the sampler nor the train step ever recompiles during a run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax import sampling
from kljax.config.rl import RLConfig
from kljax.models.config import ModelConfig
from kljax.parallel.distributed import global_from_local_rows, local_rows
from kljax.parallel.sharding import data_sharding
from kljax.policies.protocol import as_policy
from kljax.rl.advantages import Baseline
from kljax.rl.kl import KLConfig
from kljax.rl.objective import TokenLogProbs, advantages_with_kl
from kljax.tasks import prompting
from kljax.tasks.base import Example, Task
from kljax.tasks.rewards import score_batch
from kljax.train.step import Batch

Array = jax.Array


@dataclasses.dataclass
class RolloutInfo:
    """Host-side results of a rollout: texts, rewards, timings.

    In a multi-host run `completions`, `rewards` and `correct` are this process's rows only (`rows`);
    `reward_mean` and `accuracy_mean` are global.
    """

    completions: list[str]
    rewards: np.ndarray
    correct: np.ndarray
    scored: dict[str, Array]
    times: dict[str, float]
    rows: np.ndarray | None = None  # global rows of completions/rewards/correct (this process's samples)
    reward_mean: float = float("nan")  # over the whole (global) batch
    accuracy_mean: float = float("nan")
    reward_parts: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # per reward function, unweighted
    reward_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # rewards/NAME/mean, /std, /errors
    stopped: Array | None = None  # [B] global: the response ended with a stop (False: cut at rl.max_new_tokens)


def prompt_texts(examples: Sequence[Example], task: Task, tokenizer: Any, prompt_format: str) -> list[str]:
    """The text each prompt is tokenized from (`kljax.tasks.prompting.prompt_texts`)."""
    return prompting.prompt_texts(examples, task, tokenizer, prompt_format)


def encode_prompts(texts: Sequence[str], tokenizer: Any, max_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded token ids [N, max_len] int32 and mask; a prompt longer than max_len is an error."""
    ids = np.full((len(texts), max_len), pad_id, np.int32)
    mask = np.zeros((len(texts), max_len), bool)
    for i, text in enumerate(texts):
        toks = list(tokenizer.encode(text, add_special_tokens=False))
        if not toks:
            raise ValueError(f"prompt {i} is empty after tokenization: {text!r}")
        if len(toks) > max_len:
            raise ValueError(
                f"prompt {i} has {len(toks)} tokens, more than rl.max_prompt_len={max_len}; raise it or shorten "
                f"the prompt (starts {text[:60]!r})"
            )
        ids[i, max_len - len(toks) :] = toks
        mask[i, max_len - len(toks) :] = True
    return ids, mask


def sampler_is_policy(rl: RLConfig, kl: KLConfig, model: Any) -> bool:
    """Whether a rollout takes log pi of the sampled tokens and the entropy from the sampler instead of
    a policy forward pass (`rl.reuse_sampler_logprobs`).

    Exact when the sampler draws from pi itself: the current parameters (rl.async_level 0), the
    whole distribution at rl.temperature, which is the policy trained (`RLConfig.policy_temperature`;
    greedy reports temperature-1 log-probs), nothing truncated or penalized (`sampler_changes_policy`),
    computed in float32: its log-probs then equal teacher-forced ones to float rounding
    (`tests/test_sampling*.py`). In a 16-bit compute dtype the cached decode and the teacher-forced
    forward round differently, and log pi - log pi_ref would carry that into every KL estimate, so
    the batch is re-scored (docs/performance.md). kl.estimator='full' needs the policy's hidden
    states and always re-scores. Importance ratios always divide by the sampler's own log-probs.
    """
    unchanged = rl.temperature == 0.0 or not sampler_changes_policy(rl)
    exact = getattr(model, "jnp_dtype", jnp.float32) == jnp.float32
    return rl.reuse_sampler_logprobs and rl.async_level == 0 and unchanged and exact and kl.estimator != "full"


def sampler_changes_policy(rl: RLConfig) -> bool:
    """Whether the sampler draws from something other than the policy: a truncation (top-k, top-p or
    min-p on: tokens outside its support are never drawn) or a repetition penalty."""
    return rl.top_p < 1.0 or rl.top_k > 0 or rl.min_p > 0.0 or rl.repetition_penalty != 1.0


def policy_scored_in_update(rl: RLConfig, kl: KLConfig, model: Any) -> bool:
    """Whether the rollout skips the policy's scoring forward pass altogether: when the sampler's
    log-probs cannot stand in for log pi (`sampler_is_policy` is False, e.g. in 16-bit compute) but
    nothing before the update needs log pi either (no KL in the reward, no full-vocabulary KL) and
    one update is made per batch. That update's forward runs at the same, pre-update parameters,
    so it reports the KL metrics and entropy (`StepSettings.kl_metrics`) the scoring pass would
    have: the same numbers up to float rounding, one forward pass fewer per iteration.
    """
    return (not sampler_is_policy(rl, kl, model) and not kl.in_reward and kl.estimator != "full"
            and rl.updates_per_batch == 1)


def run_stops(stop: Sequence[str | int], tokenizer: Any, model_config: Any) -> sampling.Stops:
    """`rl.stop` as the sampler's stop ids and id sequences (`kljax.sampling.stops`); the transformer
    sampler only (a tabular policy's responses are its task's, ended by the task's stop token)."""
    if not stop:
        return sampling.Stops()
    vocab_size = getattr(model_config, "vocab_size", None)
    if not isinstance(model_config, ModelConfig) or vocab_size is None:
        raise ValueError(f"rl.stop={list(stop)!r} needs a transformer policy (config.model.source 'tiny', "
                         "'default' or a checkpoint directory)")
    return sampling.resolve_stops(stop, tokenizer, vocab_size)


def decode_responses(tokenizer: Any, tokens_rn: np.ndarray, mask_rn: np.ndarray) -> list[str]:
    """The text of each response's unmasked tokens (special tokens skipped)."""
    return [
        tokenizer.decode([int(t) for t, m in zip(row, mrow, strict=True) if m], skip_special_tokens=True)
        for row, mrow in zip(tokens_rn, mask_rn, strict=True)
    ]


def baseline_of(rl: RLConfig) -> Baseline:
    """The advantage baseline of a run's RL settings."""
    return Baseline(rl.advantage, rl.group_size, rl.advantage_std_eps, rl.advantage_scale)


def assemble_batch(partial: Batch, scored: dict[str, Array], rewards_b: Array, *, kl: KLConfig, beta: float | Array,
                   baseline: Baseline) -> Batch:
    """The train batch from a scored one: the reference log-probs and the advantages with the
    reward-placed KL folded in (`kljax.rl.objective.advantages_with_kl`). Pure (jit/vmap it).

    `scored` holds "ref_logp" and, unless the update scores the policy itself
    (`policy_scored_in_update`: then no KL is in the reward), "logp" (and "full_kl" for 'full')."""
    b, r = partial.response_mask_br.shape
    if "logp" in scored:
        logps = TokenLogProbs(scored["logp"], scored["ref_logp"], partial.response_mask_br, partial.sampler_logp_br,
                              scored.get("full_kl"))
        a = advantages_with_kl(kl, baseline, rewards_b, logps, beta)
    else:
        zeros = jnp.zeros((b, r), jnp.float32)
        logps = TokenLogProbs(zeros, zeros, partial.response_mask_br)
        a = advantages_with_kl(KLConfig(placement="none"), baseline, rewards_b, logps, beta)
    return dataclasses.replace(partial, ref_logp_br=scored["ref_logp"], advantages_br=a)


@dataclasses.dataclass(frozen=True)
class RolloutSetup:
    """What every rollout of a run shares: the task and tokenizer, the policy's model (a `ModelConfig`
    or a policy object, `kljax.policies`), the RL and KL settings, the prompt format, the scoring
    function `score_fn(params, ref_params, batch)`, the stop ids and pad id, where a batch is placed
    (`place`), the mesh, and the reward (`reward_fn(examples, completions, completion_ids) ->
    RewardResult`, `kljax.train.reward_set.RewardSet`; None: the task's own)."""

    task: Task
    tokenizer: Any
    model_config: Any
    rl: RLConfig
    kl: KLConfig
    score_fn: Callable[[Any, Any, Batch], dict[str, Array]]
    stop_token_ids: tuple[int, ...]
    pad_id: int
    prompt_format: str = "raw"
    place: Callable[[Batch], Batch] = lambda b: b
    mesh: Any = None
    reward_fn: Callable[[Sequence[Example], Sequence[str], Any], Any] | None = None


def rollout(setup: RolloutSetup, examples: Sequence[Example], *, sampler_params: Any, params: Any, ref_params: Any,
            beta: float, key: Array) -> tuple[Batch, RolloutInfo]:
    """Sample G responses per example with `sampler_params`, reward them, score them with `params`
    (the policy) and `ref_params`, and build the batch at KL coefficient `beta`."""
    task, tokenizer, model_config, rl, kl = setup.task, setup.tokenizer, setup.model_config, setup.rl, setup.kl
    mesh, reward_fn = setup.mesh, setup.reward_fn
    times = {}
    t0 = time.perf_counter()
    texts = prompt_texts(examples, task, tokenizer, setup.prompt_format)
    prompt_ids, prompt_mask = encode_prompts(texts, tokenizer, rl.max_prompt_len, setup.pad_id)
    reuse = sampler_is_policy(rl, kl, model_config)  # then score_fn runs the reference only (`run_build.build`)
    stops = run_stops(rl.stop, tokenizer, model_config)  # rl.stop: strings or ids that end a response like EOS
    params_s = sampling.SamplingParams(
        temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k, min_p=rl.min_p, max_new_tokens=rl.max_new_tokens,
        stop_token_ids=tuple(setup.stop_token_ids) + stops.token_ids, stop_sequences=stops.sequences,
        n=rl.group_size, entropy=reuse, chunk=rl.sampler_chunk, repetition_penalty=rl.repetition_penalty,
    )
    result = as_policy(model_config).sample(sampler_params, prompt_ids, prompt_mask, key, params_s, mesh=mesh)
    response_tokens, response_mask = result.response_tokens_rn, result.response_mask_rn
    if mesh is not None:  # rows split over the data axes: each process rewards the samples it holds
        response_tokens, response_mask = jax.device_put((response_tokens, response_mask), data_sharding(mesh, 2))
    rows, local_ids = local_rows(response_tokens)
    _, local_mask = local_rows(response_mask)
    times["sample"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    g = rl.group_size
    completions = decode_responses(tokenizer, local_ids, local_mask)
    parts, reward_metrics = {}, {}
    if reward_fn is None:
        rewards, correct = score_batch(task, [examples[i // g] for i in rows], completions)
    else:
        ids = [[int(t) for t, m in zip(row, mrow, strict=True) if m] for row, mrow in zip(local_ids, local_mask,
                                                                                          strict=True)]
        scored_rewards = reward_fn([examples[i // g] for i in rows], completions, ids)
        rewards, correct = scored_rewards.rewards, scored_rewards.correct
        parts, reward_metrics = scored_rewards.parts, scored_rewards.metrics
    rewards, correct = np.asarray(rewards, np.float32), np.asarray(correct, bool)
    b, r = response_mask.shape
    if mesh is None:
        rewards_b, correct_b = jnp.asarray(rewards), jnp.asarray(correct, jnp.float32)
    else:
        rows_sharding = data_sharding(mesh, 1)
        rewards_b = global_from_local_rows(rewards, rows, b, rows_sharding)
        correct_b = global_from_local_rows(correct.astype(np.float32), rows, b, rows_sharding)
    times["reward"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    loss_mask = response_mask & result.stopped_r[:, None] if rl.mask_truncated else response_mask
    partial = setup.place(Batch(
        tokens_bs=result.sequence_tokens_rs, mask_bs=result.sequence_mask_rs,
        positions_bs=result.sequence_positions_rs, response_mask_br=loss_mask.astype(jnp.float32),
        sampler_logp_br=jnp.asarray(result.response_logprobs_rn, jnp.float32),
        ref_logp_br=jnp.zeros((b, r), jnp.float32), advantages_br=jnp.zeros((b, r), jnp.float32),
        beta=jnp.float32(beta),
    ))
    scored = setup.score_fn(params, ref_params, partial)
    if reuse:  # the sampler drew from pi: its log-probs and entropy are the policy's
        scored = dict(scored, logp=partial.sampler_logp_br, entropy=jnp.asarray(result.response_entropy_rn))
    batch = assemble_batch(partial, scored, rewards_b, kl=kl, beta=beta, baseline=baseline_of(rl))
    # The scoring and advantages were only dispatched (JAX runs them asynchronously); wait for them, or their
    # device time would be charged to whatever blocks next (the train step's time_update). Nothing is lost
    # by waiting but the train step's dispatch latency: that step needs this batch before it can start anyway.
    jax.block_until_ready((batch, scored))
    times["score"] = time.perf_counter() - t0
    return batch, RolloutInfo(completions, rewards, correct, scored, times, rows,
                              float(jnp.mean(rewards_b)), float(jnp.mean(correct_b)), parts, reward_metrics,
                              result.stopped_r)
