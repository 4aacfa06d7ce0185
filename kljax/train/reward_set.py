"""A run's reward: the weighted sum of reward functions (and a reward model), checked value by value.

    functions = reward_functions(config.reward)            # the config's specs (or the API's callables)
    rewards = RewardSet.build(task, config.reward, functions, split)   # binds every signature: before the model loads
    rewards.add("reward_model", fn, weight)                # a reward model, once loaded
    result = rewards(examples, completions, completion_ids)  # RewardResult: total, correct, parts, metrics

Each function is called once per batch by keyword, TRL's way (`kljax.tasks.reward_functions`), each
with its own copies of the arguments: a function that mutates them changes nothing that another
function, the accuracy or the data see. Its output must be one number or None per completion. None
is "no score": that sample's sum leaves the function out (a sample no function scores is an error
naming it). A function that raises, times out, returns the wrong length, a non-number, a non-finite
value or one beyond float32's range is an error: with reward.on_error="raise" (default) a
`RewardFunctionError` (a ValueError) names the function and the example; with "skip" the offending
sequences score 0 for that function and are counted (`rewards/NAME/errors`). When a batched call fails
as a whole, items are retried alone to find the failing examples (with "raise", up to the first).
A function that calls sys.exit or os._exit, closes the run's file descriptors or is interrupted stops
the run with one line naming it (`kljax.boundary.reward_guard`).

With reward.timeout_s set, the user's functions run in a `VerifierPool` of worker processes with that
time limit per call, their module imported there, within the limit too (their code then cannot hang,
exit or crash the run); otherwise, and for the built-ins, in this process.

Correctness (the `accuracy` metric) is always the task's own check (`score_batch`): for a file task
without an answer column it is 0.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import dataclasses
import math
import numbers
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from kljax.config.run import RunConfig
from kljax.config.sections import ON_ERROR, RewardSection, choice
from kljax.errors import UserError
from kljax.tasks import reward_functions as rf
from kljax.tasks.base import Example, Task
from kljax.tasks.pool import NOT_RUN, Outcome, VerifierPool
from kljax.tasks.rewards import score_batch
from kljax.train.trl_metrics import function_metrics

FLOAT32_MAX = float(np.finfo(np.float32).max)
_HOOKS = ("trainer_state", "log_metric", "log_extra")  # not per-sample: passed as they are


class RewardFunctionError(ValueError):
    """A reward function failed (raised, timed out, or returned something other than finite numbers);
    its message is one line, whatever the function's own exception said."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


@dataclasses.dataclass
class RewardResult:
    """rewards [N] float32 (the weighted total), correct [N] bool, parts {name: [N] float32 unweighted,
    NaN where the function gave no score}, metrics (TRL's names, `kljax.train.trl_metrics`):
    {"rewards/NAME/mean", "rewards/NAME/std": over the scored samples, "rewards/NAME/errors": count
    (reward.on_error="skip"), "reward_errors": count, and each `log_metric` name: its mean}."""

    rewards: np.ndarray
    correct: np.ndarray
    parts: dict[str, np.ndarray]
    metrics: dict[str, float]


def columns_of(examples: Sequence[Example]) -> dict[str, list[Any]]:
    """The keyword columns of a batch: each example's row columns (file tasks) or metadata, plus `answer`
    (TRL's `prompt`, `completion` and `completion_ids` columns left out)."""
    rows = [dict(ex.metadata.get("columns", ex.metadata)) for ex in examples]
    for row, ex in zip(rows, examples, strict=True):
        row.setdefault("answer", ex.answer)
    keys = sorted({k for row in rows for k in row} - set(rf.NOT_COLUMNS))
    return {k: [row.get(k) for row in rows] for k in keys}


def task_columns(task: Task, split: str) -> list[str]:
    """The column names a batch of `split` passes to reward functions."""
    names = getattr(task, "column_names", None)
    if names is not None:
        return sorted(set(names) - set(rf.NOT_COLUMNS))
    return sorted(columns_of(task.examples(split, n=4, seed=0)))


def trainer_state(task: Task, split: str, step: int, position: int, max_steps: int) -> rf.TrainerState:
    """TRL's `trainer_state` at 0-based `step`: epoch = rows drawn / rows of the split (file tasks; 0 else)."""
    rows = len(task.rows(split)) if hasattr(task, "rows") else 0
    return rf.TrainerState(global_step=step, epoch=position / rows if rows else 0.0, max_steps=max_steps)


def reward_functions(r: RewardSection, given: Sequence[Any] | None = None) -> list[Any]:
    """The run's reward functions as one list of callables and `RewardRef`s: `given` (the API's
    callables or specs) or the specs of reward.functions, each spec resolved now (its module imported,
    a UserError naming it when it cannot be) unless reward.timeout_s runs it in a worker process."""
    load = r.timeout_s is None
    specs = list(r.functions) if given is None else list(given)
    out: list[Any] = []
    for f in specs:
        out.extend(rf.parse_specs(f, load=load) if isinstance(f, str) else [f])
    return out


class _NoProblem:
    problem: str | None = None


@contextlib.contextmanager
def no_guard(who: str, active: bool = True) -> Iterator[_NoProblem]:
    """The guard of a RewardSet given none: the call runs as it is (`kljax.boundary.reward_guard`
    is the one the command line and the API give)."""
    yield _NoProblem()


class _MetricLog:
    """TRL's `log_metric(name, value)` (in this process; the workers' calls go nowhere) and `log_extra`."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def __call__(self, name: str, value: float) -> None:
        self.values.setdefault(str(name), []).append(float(value))


def _discard(*_: Any, **__: Any) -> None:
    return None


class RewardSet:
    """Named reward callables with weights (see the module docstring).

    functions: (name, fn) pairs, fn a callable or a `RewardRef`; columns: the data's column names to
    bind every signature against now (None: at the first call); conversational: prompts are message
    lists and completions assistant messages (default: the task's `conversational`)."""

    def __init__(self, task: Task, functions: Sequence[tuple[str, Any]], weights: Sequence[float],
                 on_error: str = "raise", timeout_s: float | None = None, columns: Sequence[str] | None = None,
                 conversational: bool | None = None, guard: Any = None):
        choice("reward.on_error", on_error, ON_ERROR)
        if len(weights) != len(functions):
            raise ValueError(f"reward.weights has {len(weights)} values for {len(functions)} reward functions")
        names = [n for n, _ in functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward functions need distinct names, got {names}")
        self.task, self.weights = task, [float(w) for w in weights]
        self.on_error, self.timeout_s = on_error, timeout_s
        self.conversational = bool(getattr(task, "conversational", False)) if conversational is None else conversational
        self.tokenizer: Any = None  # encodes completions for `completion_ids` when a caller gives none
        self.state = rf.TrainerState()  # the trainer sets it before each rollout
        self._pool: VerifierPool | None = None
        self.guard = guard or no_guard
        self.functions = [(name, self._placed(fn)) for name, fn in functions]
        self.keywords: dict[str, tuple[str, ...]] = {}
        if columns is not None:
            self.bind(columns)

    def _placed(self, fn: Any) -> Any:
        """fn as it will run: the user's callables as picklable RewardRefs when they run in the pool."""
        if self.timeout_s is None or not rf.is_user_code(fn):
            return fn
        if not isinstance(fn, rf.RewardRef):
            return rf.callable_ref(fn)
        if fn.payload is None and fn.spec.startswith("__main__:"):  # exists only here: send it by value
            return rf.callable_ref(rf.resolve(fn.spec))
        return fn

    def _in_pool(self, fn: Any) -> bool:
        return self.timeout_s is not None and rf.is_user_code(fn)

    @classmethod
    def build(cls, task: Task, r: RewardSection, functions: Sequence[Any], split: str = "train",
              columns: Sequence[str] | None = None, guard: Any = None) -> RewardSet | None:
        """A RewardSet of `functions` (`reward_functions`) weighted by r.weights, their signatures bound
        against `columns` (default: the columns of the task's `split`); None when there are none."""
        if not functions:
            return None
        named = [(rf.function_name(f), f) for f in functions]
        if len({n for n, _ in named}) != len(named):  # the same name from two places: tell them apart
            named = [(getattr(f, "spec", n).rsplit("/", 1)[-1] if isinstance(f, rf.RewardRef) else
                      f"{getattr(f, '__module__', '')}.{n}", f) for n, f in named]
        weights = [1.0] * len(named) if r.weights is None else list(r.weights)
        if len(weights) != len(named):
            raise UserError(f"reward.weights={list(weights)!r} has {len(weights)} values for {len(named)} reward "
                            f"functions {[n for n, _ in named]}")
        return cls(task, named, weights, r.on_error, r.timeout_s,
                   columns=task_columns(task, split) if columns is None else columns, guard=guard)

    @classmethod
    def from_config(cls, config: RunConfig, task: Task, columns: Sequence[str] | None = None,
                    guard: Any = None) -> RewardSet | None:
        """`build` with config.reward's own functions (their specs resolved) and the train split."""
        return cls.build(task, config.reward, reward_functions(config.reward), config.task.split, columns, guard)

    def add(self, name: str, fn: Any, weight: float) -> None:
        """Add a function (the reward model) once it is loaded."""
        if name in dict(self.functions):
            raise ValueError(f"reward functions need distinct names; {name!r} is taken")
        self.functions.append((name, self._placed(fn)))
        self.weights.append(float(weight))
        if self.keywords:
            self.keywords[name] = self._keywords(name, self.functions[-1][1], list(self._columns))

    def bind(self, columns: Sequence[str]) -> None:
        """Bind every function's signature against the call's names and `columns` (ValueError naming it)."""
        self._columns = list(columns)
        self.keywords = {name: self._keywords(name, fn, self._columns) for name, fn in self.functions}

    def _keywords(self, name: str, fn: Any, columns: list[str]) -> tuple[str, ...]:
        spec = getattr(fn, "spec", name)
        if self._in_pool(fn):  # its module is imported in a worker, within the time limit
            (outcome,) = self._pool_map(rf.signature_of, [(fn,)])
            if not outcome.ok:
                why = outcome.error.removeprefix("ValueError: ")
                raise RewardFunctionError(f"reward function {name!r} ({spec}) could not be loaded in a reward worker "
                                          f"process: {why} (reward.timeout_s={self.timeout_s:g})")
            sig = outcome.value
        else:
            sig = rf.signature_of(fn)
        return rf.check_signature(name, spec, sig, columns)

    def _pool_map(self, fn: Any, items: list[tuple[Any, ...]], stop_on_error: bool = False,
                  budget_s: float | None = None) -> list[Outcome]:
        if self._pool is None or self._pool.closed:  # (re)opened: e.g. the final evaluation after close()
            self._pool = VerifierPool(timeout_s=self.timeout_s, preload=("kljax.train.reward_set",))
            atexit.register(self._pool.close)
        return self._pool.map(fn, items, timeout_s=self.timeout_s, stop_on_error=stop_on_error, budget_s=budget_s)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    # ------------------------------------------------------------------ scoring

    def __call__(self, examples: Sequence[Example], completions: Sequence[str],
                 completion_ids: Sequence[Sequence[int]] | None = None) -> RewardResult:
        n = len(examples)
        texts = [c if isinstance(c, str) else "" for c in completions]
        columns = columns_of(examples)
        if not self.keywords:
            self.bind(list(columns))
        if completion_ids is None:
            encode = getattr(self.tokenizer, "encode", None)
            completion_ids = [list(encode(t, add_special_tokens=False)) if encode else [] for t in texts]
        log = _MetricLog()
        batch = {
            "prompts": [ex.metadata.get("messages", ex.prompt) if self.conversational else ex.prompt
                        for ex in examples],
            "completions": [[{"role": "assistant", "content": t}] for t in texts] if self.conversational else texts,
            "completion_ids": [[int(t) for t in ids] for ids in completion_ids],
            **columns, "trainer_state": self.state, "log_metric": log, "log_extra": _discard,
        }
        total = np.zeros(n, np.float64)
        scored = np.zeros(n, bool)
        parts, metrics = {}, {}
        errors = 0
        for (name, fn), weight in zip(self.functions, self.weights, strict=True):
            kwargs = {k: batch.get(k, [None] * n) for k in self.keywords[name]}  # a column no row of it has: None
            scores, bad = self._score_one(name, fn, examples, texts, kwargs)
            parts[name] = scores.astype(np.float32)
            has = ~np.isnan(scores)
            total[has] += weight * scores[has]
            scored |= has
            metrics.update(function_metrics(name, scores))  # rewards/NAME/mean and /std
            if self.on_error == "skip":
                metrics[f"rewards/{name}/errors"] = float(bad)
            errors += bad
        metrics["reward_errors"] = float(errors)
        # log_metric(name, value): the step's mean under the name as given (TRL's); never over the set's own
        metrics = {**{k: float(np.mean(v)) for k, v in log.values.items()}, **metrics}
        self._check_total(total, scored, parts, examples, texts)
        _, correct = score_batch(self.task, list(examples), texts) if n else (None, np.zeros(0, bool))
        return RewardResult(total.astype(np.float32), np.asarray(correct, bool), parts, metrics)

    def _check_total(self, total: np.ndarray, scored: np.ndarray, parts: dict[str, np.ndarray],
                     examples: Sequence[Example], texts: list[str]) -> None:
        if not scored.all():
            i = int(np.argmin(scored))
            raise RewardFunctionError(
                f"no reward function scored {_where(examples[i], texts[i])}: each of {list(parts)} returned None "
                "for it; return a number from at least one function for every sample")
        big = np.abs(total) > FLOAT32_MAX
        if big.any():
            i = int(np.argmax(big))
            terms = ", ".join(f"{w:g} * {name} {float(parts[name][i]):.4g}"
                              for (name, _), w in zip(self.functions, self.weights, strict=True))
            raise RewardFunctionError(f"the weighted reward {total[i]:.4g} of {_where(examples[i], texts[i])} is "
                                      f"beyond float32's range ({terms}); scale the reward functions or reward.weights")

    def _run(self, name: str, fn: Any, calls: list[dict[str, Any]]) -> list[Outcome]:
        """One Outcome per call; the per-item retries (several calls) stop at the first failure under
        "raise", and in the pool get 2 x reward.timeout_s in all (a hang costs about that, not one limit
        per example; items left over fail as timed out)."""
        stop = self.on_error == "raise" and len(calls) > 1
        if self._in_pool(fn):
            budget = 2 * self.timeout_s if len(calls) > 1 else None
            return self._pool_map(rf.call, [(fn, c) for c in calls], stop_on_error=stop, budget_s=budget)
        out = []
        who, guarded = f"reward function {name!r} ({getattr(fn, 'spec', name)})", rf.is_user_code(fn)
        for kwargs in calls:
            kwargs = {k: v if k in _HOOKS else copy.deepcopy(v) for k, v in kwargs.items()}  # its own copies
            value, error = None, None
            try:
                with self.guard(who, active=guarded) as guard:  # os._exit, closed fds, crashes (boundary)
                    value = rf.call(fn, kwargs)
            except (SystemExit, KeyboardInterrupt) as e:  # would end the run without a word: say who
                what = "called sys.exit" if isinstance(e, SystemExit) else "was interrupted (KeyboardInterrupt)"
                raise RewardFunctionError(f"{who} {what}{f' ({e})' if str(e) else ''}; the run stops") from None
            except Exception as e:  # noqa: BLE001 - reported (or skipped) below, naming the function
                error = f"{type(e).__name__}: {e}"
            except BaseException as e:  # noqa: BLE001 - not an Exception: it would end the run with a traceback
                raise RewardFunctionError(f"{who} raised {type(e).__name__}, which is not an Exception; the run "
                                          "stops (raise an Exception subclass to report a failure)") from None
            if guard.problem:
                raise RewardFunctionError(f"{who} {guard.problem}; the run stops (with reward.timeout_s reward "
                                          "functions run in worker processes, where this cannot reach the run)")
            out.append(Outcome(error=error) if error else Outcome(value=value))
            if stop and _problem(out[-1], 1) is not None:
                break
        return out

    def _score_one(self, name: str, fn: Any, examples: Sequence[Example], texts: list[str],
                   kwargs: dict[str, Any]) -> tuple[np.ndarray, int]:
        """Scores [n] float64 (NaN: no score) and the number of failed samples."""
        n = len(examples)
        (outcome,) = self._run(name, fn, [kwargs])
        problem = _problem(outcome, n)
        if problem is None:
            return _as_scores(outcome.value), 0
        why, index = problem
        if index is not None:  # the values came back, some of them bad: look at each
            per_item = [Outcome(value=[v]) for v in outcome.value]
        else:  # raised, timed out, or the wrong type or length: call each item alone to find the culprits
            per_item = self._run(name, fn, [{k: v if k in _HOOKS else v[i:i + 1] for k, v in kwargs.items()}
                                            for i in range(n)])
        scores = np.zeros(n, np.float64)
        bad: list[tuple[int | None, str]] = []
        for i, o in enumerate(per_item):
            p = _problem(o, 1)
            if p is None:
                scores[i] = _as_scores(o.value)[0]
            else:
                bad.append((i, p[0]))
        if not bad:  # fails on the whole batch, on no item alone: nothing of it is kept
            bad, scores = [(None, why)], np.zeros(n, np.float64)
        if self.on_error == "raise":
            i, what = next((b for b in bad if NOT_RUN not in b[1]), bad[0])
            raise RewardFunctionError(_message(name, fn, what, None if i is None else examples[i],
                                               None if i is None else texts[i], n))
        scores[[i for i, _ in bad if i is not None]] = 0.0
        return scores, n if bad[0][0] is None else len(bad)


def _as_scores(values: Sequence[Any]) -> np.ndarray:
    return np.asarray([np.nan if v is None else float(v) for v in values], np.float64)


def _problem(outcome: Outcome, n: int) -> tuple[str, int | None] | None:
    """None when the output is n numbers within float32's range or None, else (what is wrong, the bad
    index or None)."""
    if not outcome.ok:
        worker = outcome.error.startswith(("timed out", "the worker process"))  # the pool's own words
        return (outcome.error if worker else f"raised {outcome.error}"), None
    value = outcome.value
    if not isinstance(value, (list, tuple)):
        return f"returned {type(value).__name__}, not a list of {n} numbers", None
    if len(value) != n:
        return "wrong length", None
    for i, v in enumerate(value):
        if v is None:
            continue
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.number)):
            return f"returned a non-number {type(v).__name__} {v!r:.40}", i
        if not math.isfinite(float(v)):
            return f"returned a non-finite value {float(v)}", i
        if abs(float(v)) > FLOAT32_MAX:
            return f"returned {float(v):.4g}, beyond float32's range (+-{FLOAT32_MAX:.3g}); scale it down", i
    return None


def _where(example: Example, completion: str) -> str:
    return (f"example {example.id} ({example.metadata.get('where', example.task)}, prompt {example.prompt[:60]!r}, "
            f"completion {completion[:60]!r})")


def _message(name: str, fn: Any, why: str, example: Example | None, completion: str | None, n: int) -> str:
    spec = getattr(fn, "spec", name)
    if why == "wrong length":
        why = f"returned a list of the wrong length for a batch of {n}"
    where = "on the batch" if example is None else f"on {_where(example, completion or '')}"
    return (f"reward function {name!r} ({spec}) {why} {where}; fix the function or set reward.on_error=skip "
            "to score such sequences 0")
