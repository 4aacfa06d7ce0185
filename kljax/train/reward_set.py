"""A run's reward: the weighted sum of reward functions (and a reward model), checked value by value.

    rewards = RewardSet.from_config(config, task, reward_model=None)
    result = rewards(examples, completions)     # RewardResult: total, correct, per-function scores, metrics

Each function is called once per batch (`kljax.tasks.reward_functions`). Its output must be one
finite number per completion. A function that raises, times out, returns the wrong length, a
non-number or a non-finite value is an error: with reward.on_error="raise" (default) a
`RewardFunctionError` (a ValueError) names the function and the example; with "skip" the
offending sequences score 0 for that function and are counted (`reward/NAME/errors`). When a
batched call fails as a whole, each item is retried alone to find which examples fail.

With reward.timeout_s set, the user's functions run in a `VerifierPool` of worker processes with that
time limit per call (their code then cannot hang or crash the run); otherwise, and for the built-ins,
in this process.

Correctness (the `accuracy` metric) is always the task's own check (`score_batch`): for a file task
without an answer column it is 0.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from kljax.tasks.base import Example, Task
from kljax.tasks.pool import Outcome, VerifierPool
from kljax.tasks.reward_functions import RewardRef, parse_specs
from kljax.tasks.rewards import score_batch

ON_ERROR = ("raise", "skip")


class RewardFunctionError(ValueError):
    """A reward function failed (raised, timed out, or returned something other than finite numbers)."""


@dataclasses.dataclass
class RewardResult:
    """rewards [N] float32 (the weighted total), correct [N] bool, parts {name: [N] float32 unweighted},
    metrics {"reward/NAME": mean, "reward/NAME/errors": count, "reward_errors": count}."""

    rewards: np.ndarray
    correct: np.ndarray
    parts: dict[str, np.ndarray]
    metrics: dict[str, float]


def columns_of(examples: Sequence[Example]) -> dict[str, list[Any]]:
    """The keyword columns of a batch: each example's row columns (file tasks) or metadata, plus `answer`."""
    rows = [dict(ex.metadata.get("columns", ex.metadata)) for ex in examples]
    for row, ex in zip(rows, examples, strict=True):
        row.setdefault("answer", ex.answer)
    keys = sorted({k for row in rows for k in row})
    return {k: [row.get(k) for row in rows] for k in keys}


def _call(fn: Any, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> Any:
    """Worker-side entry: the function's raw output (a module-level function, so it pickles)."""
    out = fn(prompts, completions, **columns)
    return list(out) if isinstance(out, np.ndarray) else out


class RewardSet:
    """Named reward callables with weights (see the module docstring)."""

    def __init__(self, task: Task, functions: Sequence[tuple[str, Any]], weights: Sequence[float],
                 on_error: str = "raise", timeout_s: float | None = None):
        if on_error not in ON_ERROR:
            raise ValueError(f"reward.on_error={on_error!r} is not valid; choose one of {list(ON_ERROR)}")
        if len(weights) != len(functions):
            raise ValueError(f"reward.weights has {len(weights)} values for {len(functions)} reward functions")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"reward.timeout_s={timeout_s} must be > 0 (or None to run in this process)")
        names = [n for n, _ in functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward functions need distinct names, got {names}")
        self.task, self.functions, self.weights = task, list(functions), [float(w) for w in weights]
        self.on_error, self.timeout_s = on_error, timeout_s
        self._pool: VerifierPool | None = None

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, task: Task, reward_model: Any = None) -> RewardSet | None:
        """The config's reward functions (+ the reward model, named "reward_model"); None when neither is set."""
        r = config.get("reward", ml_collections.ConfigDict())
        refs = parse_specs(str(r.get("functions", "") or ""))
        if not refs and reward_model is None:
            return None
        weights = _weights(r.get("weights", None), len(refs))
        functions: list[tuple[str, Any]] = [(ref.name, ref) for ref in refs]
        if len({n for n, _ in functions}) != len(functions):  # same function name from two places
            functions = [(ref.spec.rsplit("/", 1)[-1], ref) for ref in refs]
        if reward_model is not None:
            functions.append(("reward_model", reward_model))
            weights.append(float(r.get("model_weight", 1.0)))
        timeout = r.get("timeout_s", None)
        return cls(task, functions, weights, str(r.get("on_error", "raise")),
                   None if timeout is None else float(timeout))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    # ------------------------------------------------------------------ scoring

    def __call__(self, examples: Sequence[Example], completions: Sequence[str]) -> RewardResult:
        n = len(examples)
        prompts = [ex.prompt for ex in examples]
        completions = [c if isinstance(c, str) else "" for c in completions]
        columns = columns_of(examples)
        total = np.zeros(n, np.float64)
        parts, metrics = {}, {}
        errors = 0
        for (name, fn), weight in zip(self.functions, self.weights, strict=True):
            scores, bad = self._score_one(name, fn, examples, prompts, completions, columns)
            parts[name] = scores.astype(np.float32)
            total += weight * scores
            metrics[f"reward/{name}"] = float(np.mean(scores)) if n else float("nan")
            if self.on_error == "skip":
                metrics[f"reward/{name}/errors"] = float(bad)
            errors += bad
        metrics["reward_errors"] = float(errors)
        _, correct = score_batch(self.task, list(examples), completions) if n else (None, np.zeros(0, bool))
        return RewardResult(total.astype(np.float32), np.asarray(correct, bool), parts, metrics)

    def _run(self, fn: Any, calls: list[tuple[list[str], list[str], dict[str, list[Any]]]]) -> list[Outcome]:
        # user functions only: the built-ins never hang (math_answer has its own pool and time limit)
        in_pool = self.timeout_s is not None and isinstance(fn, RewardRef) and ":" in fn.spec
        if in_pool:
            if self._pool is None:
                self._pool = VerifierPool(timeout_s=self.timeout_s, preload=("kljax.train.reward_set",))
            return self._pool.map(_call, [(fn, *c) for c in calls], timeout_s=self.timeout_s)
        out = []
        for c in calls:
            try:
                out.append(Outcome(value=_call(fn, *c)))
            except Exception as e:  # noqa: BLE001 - reported (or skipped) below, naming the function
                out.append(Outcome(error=f"{type(e).__name__}: {e}"))
        return out

    def _score_one(self, name: str, fn: Any, examples: Sequence[Example], prompts: list[str],
                   completions: list[str], columns: dict[str, list[Any]]) -> tuple[np.ndarray, int]:
        n = len(examples)
        (outcome,) = self._run(fn, [(prompts, completions, columns)])
        problem = _problem(outcome, n)
        if problem is None:
            return np.asarray([float(v) for v in outcome.value], np.float64), 0
        why, index = problem
        if index is not None:  # the values came back, some of them bad: look at each
            per_item = [Outcome(value=[v]) for v in outcome.value]
        else:  # raised, timed out, or the wrong type or length: call each item alone to find the culprits
            calls = [([prompts[i]], [completions[i]], {k: [v[i]] for k, v in columns.items()}) for i in range(n)]
            per_item = self._run(fn, calls)
        scores = np.zeros(n, np.float64)
        bad: list[tuple[int | None, str]] = []
        for i, o in enumerate(per_item):
            p = _problem(o, 1)
            if p is None:
                scores[i] = float(o.value[0])
            else:
                bad.append((i, p[0]))
        if not bad:  # fails on the whole batch, on no item alone: nothing of it is kept
            bad, scores = [(None, why)], np.zeros(n, np.float64)
        if self.on_error == "raise":
            i, what = bad[0]
            raise RewardFunctionError(_message(name, fn, what, None if i is None else examples[i],
                                               None if i is None else completions[i], n))
        return scores, n if bad[0][0] is None else len(bad)


def _weights(value: Any, n: int) -> list[float]:
    if value is None or value == "":
        return [1.0] * n
    if isinstance(value, numbers.Real):
        value = [value]
    elif isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"reward.weights={value!r} must be numbers, one per reward function") from None
    if len(out) != n:
        raise ValueError(f"reward.weights={value!r} has {len(out)} values for {n} reward functions")
    return out


def _problem(outcome: Outcome, n: int) -> tuple[str, int | None] | None:
    """None when the output is n finite numbers, else (what is wrong, the bad index or None)."""
    if not outcome.ok:
        return f"raised {outcome.error}", None
    value = outcome.value
    if not isinstance(value, (list, tuple)):
        return f"returned {type(value).__name__}, not a list of {n} numbers", None
    if len(value) != n:
        return "wrong length", None
    for i, v in enumerate(value):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.number)):
            return f"returned a non-number {type(v).__name__} {v!r:.40}", i
        if not math.isfinite(float(v)):
            return f"returned a non-finite value {float(v)}", i
    return None


def _message(name: str, fn: Any, why: str, example: Example | None, completion: str | None, n: int) -> str:
    spec = getattr(fn, "spec", name)
    if why == "wrong length":
        why = f"returned a list of the wrong length for a batch of {n}"
    where = "on the batch" if example is None else (
        f"on example {example.id} ({example.metadata.get('where', example.task)}, prompt {example.prompt[:60]!r}, "
        f"completion {completion[:60]!r})")
    return (f"reward function {name!r} ({spec}) {why} {where}; fix the function or set reward.on_error=skip "
            "to score such sequences 0")
