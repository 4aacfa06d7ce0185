"""Reward checks and the batch scoring API.

    score_batch(task, examples, completions) -> (rewards [B] float32, correct [B] bool)

Two paths:
  - in process, for tasks whose check is an exact match that runs in linear time on any string
    (arithmetic, GSM8K, countdown, MMLU, DeepMind mathematics): these never raise on model output,
    so a check that raises, or returns anything but a finite Score, is a ValueError naming the task;
  - in a `VerifierPool` of worker processes, for tasks with `uses_verifier_pool = True` (MATH,
    MATH500: math-verify, whose sympy work can take very long on adversarial output): each item has
    a time limit (default `pool.DEFAULT_TIMEOUT_S`); an item that times out or crashes its worker
    scores 0, the worker is replaced, and the rest of the batch is kept.
Model output is only ever parsed (regular expressions, `kljax.tasks.expression`, math-verify's
LaTeX parser); it is never passed to eval/exec.
The checks: `check_integer`, `check_choice` (the letter, or the exact text of a choice), `check_math`.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence

import numpy as np

from kljax.tasks import answers
from kljax.tasks.base import RIGHT, WRONG, Example, Score, Task
from kljax.tasks.pool import VerifierPool, default_pool

MATH_VERIFY_TIMEOUT_S = 3  # math-verify's own (signal-based) limit per parse/verify, inside a worker
MATH_TAIL_CHARS = 1000  # without an explicit answer, math-verify reads this much of the completion's end
MATH_MAX_ANSWER_CHARS = 400  # a longer final answer is wrong without parsing (MATH answers are short)
MATH_MAX_NESTING = 8  # deeper bracket nesting is wrong without parsing (it makes LaTeX parsing crawl)


def check_integer(completion: str, target: str) -> Score:
    """1.0 when the completion's final answer is exactly the integer `target`."""
    return RIGHT if answers.integers_equal(answers.extract_final_answer(completion), target) else WRONG


def check_choice(completion: str, letter: str, choices: Sequence[str] = ()) -> Score:
    """1.0 when the completion picks option `letter` ("A", "B", ...)."""
    index = answers.extract_choice(completion, list(choices))
    if index is None or not letter:
        return WRONG
    return RIGHT if index == ord(letter.strip().upper()[0]) - ord("A") else WRONG


def _normalize_latex(text: str) -> str:
    text = answers.clean_answer(text)
    for old in ("\\left", "\\right", "\\!", "\\,", "\\ ", "dfrac", "tfrac", " "):
        text = text.replace(old, "frac" if old in ("dfrac", "tfrac") else "")
    return text


def bracket_depth(text: str) -> int:
    """The deepest nesting of (), [] and {} in `text` (unbalanced closers are ignored)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}" and depth:
            depth -= 1
    return deepest


@functools.lru_cache(maxsize=4096)
def _parse_target(target: str, timeout: int | None) -> list:
    from math_verify import parse

    return parse(f"\\boxed{{{target}}}", parsing_timeout=timeout)


def check_math(completion: str, target: str) -> Score:
    """1.0 when math-verify finds the completion's final answer equivalent to `target` (\\frac{1}{2} == 0.5 == 1/2).

    The final answer is the last \\boxed{} or "Answer:" (see `answers.extract_final_answer`); when the
    completion states neither, math-verify's own extraction reads its last `MATH_TAIL_CHARS`
    characters. Identical normalized strings match without math-verify; an answer longer than
    `MATH_MAX_ANSWER_CHARS` or nested deeper than `MATH_MAX_NESTING` is wrong without parsing. Run it
    through `score_batch` (a worker with a time limit): math-verify can take very long on hostile input.
    """
    if not isinstance(completion, str) or not isinstance(target, str):
        return WRONG
    from math_verify import parse, verify  # imported here: `import kljax.tasks` stays light

    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    predicted = answers.extract_final_answer(completion)
    if predicted is None:
        return WRONG
    if _normalize_latex(predicted) == _normalize_latex(target):
        return RIGHT
    to_parse = f"\\boxed{{{predicted}}}" if answers.has_answer_marker(completion) else completion[-MATH_TAIL_CHARS:]
    if len(predicted) > MATH_MAX_ANSWER_CHARS or bracket_depth(to_parse) > MATH_MAX_NESTING + 1:
        return WRONG
    gold = _parse_target(target, timeout)
    guess = parse(to_parse, parsing_timeout=timeout)
    if not gold or not guess:
        return WRONG
    return RIGHT if verify(gold, guess, timeout_seconds=timeout) else WRONG


def _check_in_process(task: Task, example: Example, completion: object) -> Score:
    if not isinstance(completion, str):
        return WRONG
    try:
        value = task.check(example, completion)
    except Exception as e:  # the in-process checks never raise on model output: this is a bug in the check
        raise ValueError(f"task {task.name!r}: check() raised {type(e).__name__}: {e} on example {example.id} "
                         f"(completion {completion[:60]!r})") from e
    return _as_score(value, task, example)


def _as_score(value: object, task: Task, example: Example) -> Score:
    """`value` as a Score; anything but a (finite reward, correct) pair is a ValueError naming the task."""
    try:
        reward, correct = value  # type: ignore[misc]
        reward = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"task {task.name!r}: check() returned {type(value).__name__} {value!r:.40} on example "
                         f"{example.id}; it must return a Score(reward, correct)") from None
    if not math.isfinite(reward):
        raise ValueError(f"task {task.name!r}: check() returned the non-finite reward {reward} on example {example.id}")
    return Score(reward, bool(correct))


def score_batch(
    task: Task,
    examples: Sequence[Example],
    completions: Sequence[str],
    *,
    pool: VerifierPool | None = None,
    timeout_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Rewards [B] (float32) and correctness [B] (bool) of `completions[i]` against `examples[i]`.

    Never raises on model output: a malformed completion, or a pool check that raises, times out or
    crashes its worker, scores (0.0, False). A check that returns something other than a finite
    Score, or an in-process check that raises, is a ValueError (a bug in the check, not the output).
    `pool` (default: the process-wide `default_pool()`) and `timeout_s` (per item) apply to tasks
    with `uses_verifier_pool`; the others run in this process.
    """
    if len(examples) != len(completions):
        raise ValueError(f"{len(examples)} examples but {len(completions)} completions")
    if task.uses_verifier_pool and len(examples):
        pool = pool if pool is not None else default_pool()
        items = [(ex, c if isinstance(c, str) else "") for ex, c in zip(examples, completions, strict=True)]
        outcomes = pool.map(task.check, items, timeout_s=timeout_s)
        scores = [_as_score(o.value, task, ex) if o.ok else WRONG for o, (ex, _) in zip(outcomes, items, strict=True)]
    else:
        scores = [_check_in_process(task, ex, c) for ex, c in zip(examples, completions, strict=True)]
    rewards = np.asarray([s.reward for s in scores], dtype=np.float32)
    correct = np.asarray([s.correct for s in scores], dtype=bool)
    return rewards, correct


def score_one(task: Task, example: Example, completion: str) -> Score:
    """One completion scored with the same guards as a batch: a time limit, and never raises."""
    rewards, correct = score_batch(task, [example], [completion])
    return Score(float(rewards[0]), bool(correct[0]))
