"""Greedy evaluation of a policy on a task's splits, batched through the sampler (before/after a run,
and every config.eval_every steps). Each split reports the task's accuracy, the run's reward (the
weighted sum of its reward functions, or the task's own reward when it has none) and, with reward
functions, each one's mean (`rewards`: {name: mean over the samples it scored}).

Multi-host: every process runs the sampler on its shards, then gathers the completions and scores
all of them (evaluation is small next to training; every process returns the same numbers).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from kljax import sampling
from kljax.parallel.distributed import gather
from kljax.policies.protocol import as_policy
from kljax.tasks.rewards import score_batch
from kljax.train.rollout import decode_responses, encode_prompts, prompt_texts, run_stops


def greedy_completions(policy: Any, params: Any, texts: list[str], max_prompt_len: int, max_new_tokens: int,
                       batch_size: int, mesh: Any = None, stop: tuple[str | int, ...] = ()) -> list[str]:
    """Greedy completions of `texts`, `batch_size` prompts per sampler call (the last batch padded),
    ended by the policy's stop ids and `stop` (rl.stop: strings or ids, `kljax.sampling.stops`)."""
    stops = run_stops(stop, policy.tokenizer, policy.model)
    settings = sampling.SamplingParams(greedy=True, temperature=0.0, max_new_tokens=max_new_tokens,
                                       stop_token_ids=tuple(policy.stop_token_ids) + stops.token_ids,
                                       stop_sequences=stops.sequences, n=1)
    out: list[str] = []
    for i in range(0, len(texts), batch_size):
        chunk = texts[i : i + batch_size]
        padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
        ids, mask = encode_prompts(padded, policy.tokenizer, max_prompt_len, policy.pad_id)
        result = as_policy(policy.model).sample(params, ids, mask, jax.random.PRNGKey(0), settings, mesh=mesh)
        tokens, response_mask = gather((result.response_tokens_rn, result.response_mask_rn))
        texts_out = decode_responses(policy.tokenizer, tokens, response_mask)
        out.extend(texts_out[: len(chunk)])
    return out


def evaluate_splits(run: Any, params: Any) -> dict[str, dict[str, Any]]:
    """{split: {"accuracy", "reward", "n"[, "rewards": {name: mean}]}} for each of config.task.eval_splits
    (greedy decoding; see the module docstring)."""
    config = run.config
    rl = config.rl
    results = {}
    for split in config.task.eval_split_names:
        examples = run.task.examples(split, n=config.eval_examples, seed=config.seed)
        texts = prompt_texts(examples, run.task, run.policy.tokenizer, config.task.prompt_format)
        completions = greedy_completions(run.policy, params, texts, rl.max_prompt_len, rl.max_new_tokens,
                                         rl.batch_size, run.mesh, stop=rl.stop)
        reward_set = getattr(run, "reward", None)
        if reward_set is None:
            rewards, correct = score_batch(run.task, examples, completions)
            results[split] = {"accuracy": float(np.mean(correct)), "reward": float(np.mean(rewards)),
                              "n": len(examples)}
            continue
        scored = reward_set(examples, completions)  # the run's reward functions, as in training
        results[split] = {"accuracy": float(np.mean(scored.correct)), "reward": float(np.mean(scored.rewards)),
                          "n": len(examples), "rewards": {name: _mean(v) for name, v in scored.parts.items()}}
    return results


def _mean(scores: np.ndarray) -> float:
    """Mean over the samples a function scored (NaN: no score), NaN when it scored none."""
    scores = np.asarray(scores, np.float64)
    has = np.isfinite(scores)
    return float(scores[has].mean()) if has.any() else float("nan")
