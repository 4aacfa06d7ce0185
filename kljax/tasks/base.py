"""The task interface: an `Example` record, a `Score`, and the `Task` base classes.

A task hands out examples for a split and scores a completion against one:

    task.examples(split, n=None, seed=0) -> list[Example]   deterministic for (split, n, seed)
    task.check(example, completion)      -> Score           the bare scoring logic, in this process

Batches go through `kljax.tasks.rewards.score_batch`, which runs `check` in this process for the
exact-match tasks (`uses_verifier_pool = False`) and in a pool of worker processes with a per-item
time limit for the others (math-verify).

Generated tasks (`GeneratedTask`) draw problems from a seeded RNG. Their in-domain `train` and `test`
splits are disjoint by construction: every problem has a canonical key, and a hash of the key puts it
in exactly one of the two (a fraction `test_fraction` of the key space, default 0.1, is test). Out-of-domain splits are
disjoint from both by construction (other sizes or operations), which the tests check.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import random
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

TEST_FRACTION = 0.1  # share of an in-domain generated key space that belongs to `test`


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt with its reference answer.

    prompt:   the problem statement (no instructions about the answer format; see `prompting`)
    answer:   the reference answer as text (an integer, a LaTeX expression, a choice letter, ...)
    task:     the registry name of the task that made it
    split:    the split it belongs to
    id:       an id unique within (task, split); stable across runs
    metadata: anything else (e.g. the numbers of a countdown problem, the choices of an MMLU question)
    """

    prompt: str
    answer: str
    task: str
    split: str
    id: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


class Score(NamedTuple):
    """A scored completion: the scalar reward and whether the final answer is correct."""

    reward: float
    correct: bool


WRONG = Score(0.0, False)
RIGHT = Score(1.0, True)


class Task(abc.ABC):
    """A named set of splits with a reward.

    Subclasses set `name` and `splits`, implement `examples` and `check`, and may change:
      answer_format: how prompts ask for the final answer: "boxed" (\\boxed{...}) or "answer_line"
                     ("Answer: ...");
      instruction:   a task-specific line added to the user message (e.g. "Reply with the letter ...");
      uses_verifier_pool: True when `check` may be slow or hang (math-verify): it then runs in worker
                     processes with a time limit;
      tokenizer:     a tokenizer of the task's own, when its token ids are its responses (None: the
                     model's), with `check_run_settings` and `exact_optimum` for a task whose optimum
                     is known (`kljax.tasks.toy_optimum`).
    """

    name: str = ""
    splits: tuple[str, ...] = ()
    answer_format: str = "boxed"
    instruction: str = ""
    uses_verifier_pool: bool = False
    tokenizer: Any = None

    @abc.abstractmethod
    def examples(self, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
        """Examples of `split`: all of them (loaded) or a default number (generated) when n is None."""

    @abc.abstractmethod
    def check(self, example: Example, completion: str) -> Score:
        """Score `completion` against `example` in this process (no time limit; may raise)."""

    def check_run_settings(self, max_prompt_len: int, max_new_tokens: int, prompt_format: str) -> None:
        """Raise a ValueError naming the setting when a run's buffers or prompt format cannot serve
        this task (none is refused here)."""
        return None

    def exact_optimum(self, model: Any, ref_params: Any) -> Callable[[Any, float], dict[str, float]] | None:
        """For a task whose KL-regularized optimum is known against the reference `ref_params` of
        `model`: a function (params, beta) -> {"exact/NAME": value} of exact metrics; else None."""
        return None

    def validate_split(self, split: str) -> None:
        """Raise a ValueError naming the valid splits when `split` is not one of them."""
        if split not in self.splits:
            raise ValueError(f"task {self.name!r} has no split {split!r}; valid splits: {list(self.splits)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, splits={self.splits})"


def stable_hash(key: Hashable) -> int:
    """A hash of `repr(key)` that is the same in every process and run (unlike `hash`)."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "big")


def in_test_split(key: Hashable, test_fraction: float = TEST_FRACTION) -> bool:
    """Whether an in-domain key belongs to `test` (else `train`): true for `test_fraction` of all keys."""
    return stable_hash(("split", key)) % 1000 < int(test_fraction * 1000)


def seeded_rng(*parts: object) -> random.Random:
    """A `random.Random` seeded from a string of `parts` (string seeds are stable across runs)."""
    return random.Random("/".join(str(p) for p in parts))


class GeneratedTask(Task):
    """A task whose problems come from a seeded generator.

    Subclasses implement `_draw(rng, split) -> (key, example_fields) | None`: draw one problem of
    `split` (None when a draw fails and should be retried). This class deduplicates keys within a call,
    keeps in-domain `train`/`test` apart by `in_test_split(key, test_fraction)`, and fails clearly when a split cannot
    supply `n` distinct problems.
    """

    in_domain_splits: tuple[str, ...] = ("train", "test")
    test_fraction: float = TEST_FRACTION
    default_size: dict[str, int] = {}
    max_draws_per_example: int = 200

    def examples(self, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
        """`n` distinct problems of `split` (default `default_size[split]`), the same for the same seed."""
        self.validate_split(split)
        if n is None:
            n = self.default_size.get(split, 1000)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = seeded_rng(self.name, self.config_id(), split, seed)
        out: list[Example] = []
        seen: set[Hashable] = set()
        budget = self.max_draws_per_example * n + 1000
        while len(out) < n:
            if budget <= 0:
                raise ValueError(
                    f"task {self.name!r} split {split!r} could only make {len(out)} distinct problems of "
                    f"the {n} asked; ask for fewer or widen the task's ranges"
                )
            budget -= 1
            drawn = self._draw(rng, split)
            if drawn is None:
                continue
            key, fields = drawn
            if key in seen:
                continue
            if split in self.in_domain_splits and in_test_split(key, self.test_fraction) != (split == "test"):
                continue
            seen.add(key)
            out.append(Example(task=self.name, split=split, **fields))
        return out

    def config_id(self) -> str:
        """A string naming the settings that change the problems (mixed into the RNG seed)."""
        return ""

    @abc.abstractmethod
    def _draw(self, rng: random.Random, split: str) -> tuple[Hashable, dict[str, Any]] | None:
        """One problem of `split`: its canonical key and Example fields (prompt, answer, id, metadata)."""
