"""Evaluation of a policy on a task's splits: greedy accuracy and the accuracy of the policy a run
trains (`samples` completions per problem at the run's temperature), each with a 95% interval.

    plan = EvalPlan(splits=("test", "ood_digits"), n_examples=256, seed=0, samples=2, temperature=0.8, ...)
    outcomes = evaluate_outcomes(policy, params, task, plan, score, mesh)    # per problem, per split
    results = summarize(outcomes, plan)                                     # what eval_*.json holds
    deltas = paired_deltas(before_results, results, plan.seed)              # after - before, per split

The problems are `task.examples(split, n_examples, seed)` and the sampling keys depend on the seed, the
split's position and the call only, so two evaluations with one plan see the same problems and the same
random numbers (their change is paired, with common random numbers). Each problem is one group of
1 + samples sampler rows sharing one prefill, its first row greedy (`SamplingParams.greedy_first`); every
sampler call has rows_per_call / (1 + samples) problems, the last call padded, so an evaluation compiles
once per prompt-length bucket. Multi-host: every process samples its shards, then gathers the completions
and scores all of them (every process returns the same numbers).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kljax import sampling
from kljax.models.config import ModelConfig
from kljax.parallel.distributed import gather
from kljax.policies.protocol import as_policy
from kljax.sampling.step import cache_bytes
from kljax.tasks.base import Example
from kljax.tasks.rewards import score_batch
from kljax.train import intervals
from kljax.train.rollout import decode_responses, encode_prompts, prompt_texts, run_stops

# score(examples, completions) -> (rewards [N], correct [N], {reward function name: [N] values})
ScoreFn = Callable[[Sequence[Example], Sequence[str]], tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """splits: split names; n_examples problems of each (n_examples_ood of each out-of-domain split,
    named ood*, when > 0), drawn with `seed`; samples: completions per problem at `temperature`
    (top_p, top_k, min_p) for the sampled accuracy (0: greedy only);
    max_prompt_len, max_new_tokens: the buffers; rows_per_call: sequences per sampler call;
    prompt_format: chat, plain or raw; stop: rl.stop (strings or ids ending a response)."""

    splits: tuple[str, ...]
    n_examples: int
    seed: int
    samples: int
    temperature: float
    max_prompt_len: int
    max_new_tokens: int
    rows_per_call: int
    prompt_format: str
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str | int, ...] = ()
    n_examples_ood: int = 0

    def size(self, split: str) -> int:
        """Problems evaluated of `split`."""
        return self.n_examples_ood if split.startswith("ood") and self.n_examples_ood > 0 else self.n_examples

    def __post_init__(self) -> None:
        if self.n_examples < 1 or self.samples < 0 or self.rows_per_call < 1 + self.samples:
            raise ValueError(f"an evaluation needs n_examples >= 1, samples >= 0 and rows_per_call >= 1 + samples; "
                             f"got {self.n_examples}, {self.samples}, {self.rows_per_call}")


@dataclasses.dataclass
class SplitOutcome:
    """Per-problem results of one split: ids [P]; greedy_correct/greedy_reward [P]; sampled_correct /
    sampled_reward [P, samples]; greedy_parts {reward function: [P]}; greedy completions [P];
    example: the first problem (prompt, answer) and its greedy completion; checked: some problem has
    an answer to check (else accuracy means nothing and the reward is what the run is scored by)."""

    ids: list[str]
    greedy_correct: np.ndarray
    greedy_reward: np.ndarray
    sampled_correct: np.ndarray
    sampled_reward: np.ndarray
    greedy_parts: dict[str, np.ndarray]
    completions: list[str]
    example: dict[str, Any] = dataclasses.field(default_factory=dict)
    checked: bool = True


def _call_rows(rows_per_call: int, per_prompt: int, shards: int) -> int:
    """Prompts per sampler call: rows_per_call / per_prompt, at least one per data shard, a multiple of them."""
    prompts = max(1, rows_per_call // max(1, per_prompt))
    return max(shards, -(-prompts // shards) * shards)


def _shards(mesh: Any) -> int:
    return 1 if mesh is None else int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))


def complete(policy: Any, params: Any, texts: Sequence[str], settings: sampling.SamplingParams, key: jax.Array,
             rows_per_call: int, max_prompt_len: int, mesh: Any = None,
             progress: Callable[[int], None] | None = None) -> list[list[str]]:
    """`settings.n` completions of each text, rows_per_call / n prompts per sampler call (the last call
    padded with copies of its last prompt, so every call has one shape); call b draws with
    fold_in(key, b). `progress(sequences)` is called after each call."""
    per_call = _call_rows(rows_per_call, settings.n, _shards(mesh))
    sampler = as_policy(policy.model)
    out: list[list[str]] = []
    for b, i in enumerate(range(0, len(texts), per_call)):
        chunk = list(texts[i : i + per_call])
        padded = chunk + [chunk[-1]] * (per_call - len(chunk))
        ids, mask = encode_prompts(padded, policy.tokenizer, max_prompt_len, policy.pad_id)
        result = sampler.sample(params, ids, mask, jax.random.fold_in(key, b), settings, mesh=mesh)
        tokens, response_mask = gather((result.response_tokens_rn, result.response_mask_rn))
        decoded = decode_responses(policy.tokenizer, tokens, response_mask)
        n = settings.n
        out.extend(decoded[j * n : (j + 1) * n] for j in range(len(chunk)))
        if progress is not None:
            progress(len(chunk) * n)
    return out


def sampling_settings(plan: EvalPlan, policy: Any) -> sampling.SamplingParams:
    """The sampler settings of `plan`: 1 + samples rows per problem, the first greedy, the others at
    plan.temperature (`SamplingParams.greedy_first`), ended by the policy's stop ids and plan.stop."""
    stops = run_stops(plan.stop, policy.tokenizer, policy.model)
    common = dict(max_new_tokens=plan.max_new_tokens, stop_token_ids=tuple(policy.stop_token_ids) + stops.token_ids,
                  stop_sequences=stops.sequences)
    if not plan.samples:
        return sampling.SamplingParams(greedy=True, temperature=0.0, n=1, **common)
    return sampling.SamplingParams(temperature=plan.temperature, top_p=plan.top_p, top_k=plan.top_k,
                                   min_p=plan.min_p, n=1 + plan.samples, greedy_first=True, **common)


def evaluate_split(policy: Any, params: Any, examples: Sequence[Example], texts: Sequence[str], score: ScoreFn,
                   plan: EvalPlan, key: jax.Array, mesh: Any = None,
                   progress: Callable[[int], None] | None = None) -> SplitOutcome:
    """Greedy and sampled outcomes of `examples` (prompted as `texts`), drawn with `key`: one sampler
    row group per problem, its first row greedy (see `sampling_settings`)."""
    settings = sampling_settings(plan, policy)
    groups = complete(policy, params, texts, settings, key, plan.rows_per_call, plan.max_prompt_len, mesh, progress)
    p, k = len(examples), plan.samples
    rewards, correct, parts = score([ex for ex in examples for _ in range(1 + k)], [c for g in groups for c in g])
    correct_pn = np.asarray(correct, bool).reshape(p, 1 + k)
    rewards_pn = np.asarray(rewards, np.float32).reshape(p, 1 + k)
    greedy_parts = {name: np.asarray(v).reshape(p, 1 + k)[:, 0] for name, v in parts.items()}
    example = {"prompt": examples[0].prompt, "answer": examples[0].answer, "greedy": groups[0][0]}
    return SplitOutcome([ex.id for ex in examples], correct_pn[:, 0], rewards_pn[:, 0], correct_pn[:, 1:],
                        rewards_pn[:, 1:], greedy_parts, [g[0] for g in groups], example,
                        any(str(ex.answer).strip() for ex in examples))


def evaluate_outcomes(policy: Any, params: Any, task: Any, plan: EvalPlan, score: ScoreFn, mesh: Any = None,
                      progress: Callable[[int], None] | None = None) -> dict[str, SplitOutcome]:
    """{split: SplitOutcome} for every split of the plan (split i draws with fold_in(PRNGKey(seed), i))."""
    out = {}
    for i, split in enumerate(plan.splits):
        examples = task.examples(split, n=plan.size(split), seed=plan.seed)
        texts = prompt_texts(examples, task, policy.tokenizer, plan.prompt_format)
        key = jax.random.fold_in(jax.random.PRNGKey(plan.seed), i)
        out[split] = evaluate_split(policy, params, examples, texts, score, plan, key, mesh, progress)
    return out


def sequences(plan: EvalPlan, sizes: Sequence[int]) -> int:
    """How many sequences an evaluation of splits of `sizes` problems samples (for a progress bar)."""
    return sum(sizes) * (1 + plan.samples)


def _mean(scores: np.ndarray) -> float:
    """Mean over the samples a function scored (NaN: no score), NaN when it scored none."""
    scores = np.asarray(scores, np.float64)
    has = np.isfinite(scores)
    return float(scores[has].mean()) if has.any() else float("nan")


def summarize_split(o: SplitOutcome, plan: EvalPlan) -> dict[str, Any]:
    """The JSON entry of one split: `greedy` and `sampled`, each {"accuracy", "ci95": [lo, hi], "n": problems}
    (`kljax.train.intervals`), `accuracy` and `reward` (greedy), `sampled_reward`, with reward functions
    `rewards` {name: greedy mean}, `example` (the first problem and its greedy answer) and `problems`
    {ids, greedy, sampled}: every problem's outcome, so that a later evaluation pairs with it problem by problem."""
    entry: dict[str, Any] = {
        "accuracy": float(np.mean(o.greedy_correct)), "reward": float(np.mean(o.greedy_reward)),
        "n": len(o.ids), "greedy": intervals.accuracy_entry(o.greedy_correct),
    }
    if o.sampled_correct.shape[1]:
        entry["sampled"] = {**intervals.accuracy_entry(o.sampled_correct, plan.seed),
                            "k": int(o.sampled_correct.shape[1]), "temperature": plan.temperature}
        entry["sampled_reward"] = float(np.mean(o.sampled_reward))
    if o.greedy_parts:
        entry["rewards"] = {name: _mean(v) for name, v in o.greedy_parts.items()}
    if o.example:
        entry["example"] = o.example
    entry["problems"] = {"ids": list(o.ids), "greedy": o.greedy_correct.astype(int).tolist(),
                         "sampled": o.sampled_correct.astype(int).tolist()}
    if not o.checked:  # no answers to check: the reward, with its intervals, is the score
        entry["scored_by"] = "reward"
        entry["reward_greedy"] = _reward_entry(o.greedy_reward[:, None], plan.seed)
        if o.sampled_reward.shape[1]:
            entry["reward_sampled"] = {**_reward_entry(o.sampled_reward, plan.seed),
                                       "k": int(o.sampled_reward.shape[1]), "temperature": plan.temperature}
        entry["problems"].update(reward_greedy=o.greedy_reward.astype(float).tolist(),
                                 reward_sampled=o.sampled_reward.astype(float).tolist())
    return entry


def _reward_entry(rewards_pk: np.ndarray, seed: int) -> dict[str, Any]:
    """{"mean", "ci95", "n"} of rewards [P, k] (the bootstrap over problems)."""
    values_pk = np.asarray(rewards_pk, np.float64)
    lo, hi = intervals.cluster_bootstrap_interval(values_pk, seed)
    return {"mean": float(values_pk.mean()), "ci95": [lo, hi], "n": int(values_pk.shape[0])}


def summarize(outcomes: Mapping[str, SplitOutcome], plan: EvalPlan) -> dict[str, dict[str, Any]]:
    """{split: entry} (see `summarize_split`)."""
    return {split: summarize_split(o, plan) for split, o in outcomes.items()}


def paired_deltas(before: Mapping[str, Any], after: Mapping[str, Any], seed: int) -> dict[str, dict[str, Any]]:
    """{split: {"greedy": {"diff", "ci95"}, "sampled": {...}}}: the change from `before` to `after`
    (two `summarize` results), problem by problem. A split is paired only when both hold the same
    problems (ids, in order); splits that are not are left out."""
    out: dict[str, dict[str, Any]] = {}
    for split, a in after.items():
        b = before.get(split) or {}
        pa, pb = a.get("problems") or {}, b.get("problems") or {}
        if not pa.get("ids") or pa.get("ids") != pb.get("ids"):
            continue
        delta = {"greedy": intervals.paired_change(np.asarray(pb["greedy"]), np.asarray(pa["greedy"]), seed)}
        sa, sb = np.asarray(pa.get("sampled", [])), np.asarray(pb.get("sampled", []))
        if sa.ndim == 2 and sa.shape[1] and sa.shape == sb.shape:
            delta["sampled"] = intervals.paired_change(sb, sa, seed)
        for key in ("reward_greedy", "reward_sampled"):  # splits scored by their reward
            ra, rb = np.asarray(pa.get(key, [])), np.asarray(pb.get(key, []))
            if ra.size and ra.shape == rb.shape:
                delta[key] = intervals.paired_change(rb.reshape(len(rb), -1), ra.reshape(len(ra), -1), seed)
        out[split] = delta
    return out


def with_deltas(before: Mapping[str, Any], after: dict[str, dict[str, Any]], seed: int) -> dict[str, dict[str, Any]]:
    """`after` with each paired split's `delta_vs_before` (`paired_deltas`) added to its entry."""
    for split, delta in paired_deltas(before, after, seed).items():
        after[split]["delta_vs_before"] = delta
    return after


def before_results(workdir: Path) -> dict[str, Any]:
    """A run's eval_before.json ({} when there is none or it cannot be read)."""
    try:
        loaded = json.loads((Path(workdir) / "eval_before.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def eval_note(plan: EvalPlan, when: str) -> str:
    """The line a run prints before an evaluation: what it samples (the first one also compiles)."""
    sampled = (f" + {plan.samples} samples at temperature {plan.temperature:g}" if plan.samples else "")
    sizes = ", ".join(f"{split} {plan.size(split)}" for split in plan.splits)
    total = sum(plan.size(split) for split in plan.splits) * (1 + plan.samples)
    return (f"evaluating {when}: at most {sizes} problems, each greedy{sampled} "
            f"(up to {total} sequences; the first evaluation also compiles the sampler)")


def scorer(task: Any, reward_set: Any = None) -> ScoreFn:
    """The run's scoring: its reward functions (as in training) or, without them, the task's own reward."""
    def score(examples: Sequence[Example], completions: Sequence[str]) -> tuple[np.ndarray, np.ndarray, dict]:
        if reward_set is None:
            rewards, correct = score_batch(task, examples, completions)
            return rewards, correct, {}
        scored = reward_set(examples, completions)
        return scored.rewards, scored.correct, scored.parts

    return score


# ------------------------------------------------------------------------------- the run's call site


EVAL_ROWS_PER_CALL = 160  # sampler rows per call in a run's evaluation, memory permitting
EVAL_CACHE_BYTES = 2 << 30  # ... the KV cache of a call at most this, or the rollout's rows


def rows_per_call(model: Any, rollout_rows: int, width: int, samples: int) -> int:
    """Sampler rows per evaluation call: EVAL_ROWS_PER_CALL (whole groups of 1 + samples rows), fewer
    where that KV cache of `width` slots would pass EVAL_CACHE_BYTES, never fewer than a rollout's."""
    rows = EVAL_ROWS_PER_CALL
    if isinstance(model, ModelConfig):
        while rows > 1 + samples and cache_bytes(model, rows, width) > EVAL_CACHE_BYTES:
            rows //= 2
    group = 1 + samples
    return max(group, max(rows, rollout_rows) // group * group)


def plan_for_run(run: Any) -> EvalPlan:
    """The EvalPlan of a `kljax train` run, from its config (the one place that reads it)."""
    config = run.config
    rl = config.rl
    width = rl.max_prompt_len + rl.max_new_tokens
    return EvalPlan(
        splits=config.task.eval_split_names, n_examples=config.eval_examples, n_examples_ood=config.eval_examples_ood,
        seed=config.seed, samples=config.eval_samples, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
        min_p=rl.min_p, max_prompt_len=rl.max_prompt_len, max_new_tokens=rl.max_new_tokens,
        prompt_format=config.task.prompt_format, stop=tuple(rl.stop),
        rows_per_call=rows_per_call(run.policy.model, rl.batch_size, width, config.eval_samples),
    )


def evaluate_splits(run: Any, params: Any, progress: Callable[[int], None] | None = None) -> dict[str, dict[str, Any]]:
    """{split: entry} of a run's evaluation of `params` (see the module docstring)."""
    plan = plan_for_run(run)
    outcomes = evaluate_outcomes(run.policy, params, run.task, plan, scorer(run.task, getattr(run, "reward", None)),
                                 run.mesh, progress)
    return summarize(outcomes, plan)


def greedy_completions(policy: Any, params: Any, texts: list[str], max_prompt_len: int, max_new_tokens: int,
                       batch_size: int, mesh: Any = None, stop: tuple[str | int, ...] = ()) -> list[str]:
    """Greedy completions of `texts`, `batch_size` prompts per sampler call (the last batch padded),
    ended by the policy's stop ids and `stop` (rl.stop: strings or ids, `kljax.sampling.stops`)."""
    plan = EvalPlan(splits=(), n_examples=1, seed=0, samples=0, temperature=0.0, max_prompt_len=max_prompt_len,
                    max_new_tokens=max_new_tokens, rows_per_call=batch_size, prompt_format="raw", stop=stop)
    return [c[0] for c in complete(policy, params, texts, sampling_settings(plan, policy), jax.random.PRNGKey(0),
                                   batch_size, max_prompt_len, mesh)]
