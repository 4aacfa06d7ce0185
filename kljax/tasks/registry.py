"""Task names -> constructors, in one table.

    get_task("arithmetic")                      generated: train, test, ood_digits, ood_ops
    get_task("countdown")                       generated: train, test, ood_numbers
    get_task("dm_math")                         generated (needs `mathematics_dataset`): train, test, ood
    get_task("math", data_dir=...)             loaded: train (MATH), test (MATH500); "math500": test alone
    get_task("gsm8k")                           loaded: train, test
    get_task("mmlu", subject="college_physics") loaded: test (any MMLU STEM subject); "mmlu_college_physics",
                                                _chemistry, _biology: the paper's OOD sets
    get_task("repeat_digit")                    toy task for tiny models (kljax/tasks/toy.py): train, test
    get_task("toy_optimum", shapes=..., vocab=3, response_len=3)    exact optimum (tasks/toy_optimum.py): train
The user's own files (`jsonl`, `parquet`, `csv`, `hf`) are not registered: `kljax.tasks.from_config` builds
them from config.task (`kljax.tasks.files.FileTask`). A spec "name:split" (e.g. "arithmetic:ood_ops") names a
task and one of its splits (`parse_task_spec`). Unknown names and splits are ValueErrors listing valid ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kljax.tasks.arithmetic import ArithmeticTask
from kljax.tasks.base import Task
from kljax.tasks.benchmarks import GSM8KTask, Math500Task, MathTask, MMLUTask
from kljax.tasks.countdown import CountdownTask
from kljax.tasks.dm_math import DeepMindMathTask
from kljax.tasks.toy import RepeatDigitTask
from kljax.tasks.toy_optimum import ToyOptimumTask


def _repeat_digit(**kwargs: Any) -> Task:

    return RepeatDigitTask(**kwargs)


def _toy_optimum(**kwargs: Any) -> Task:

    return ToyOptimumTask(**kwargs)


def _dm_math(**kwargs: Any) -> Task:

    return DeepMindMathTask(**kwargs)


TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "dm_math": _dm_math,
    "math": MathTask,
    "math500": Math500Task,
    "gsm8k": GSM8KTask,
    "mmlu": MMLUTask,
    "mmlu_college_physics": functools.partial(MMLUTask, "college_physics"),
    "mmlu_college_chemistry": functools.partial(MMLUTask, "college_chemistry"),
    "mmlu_college_biology": functools.partial(MMLUTask, "college_biology"),
    "repeat_digit": _repeat_digit,
    "toy_optimum": _toy_optimum,
}


def task_names() -> list[str]:
    """The registered task names."""
    return sorted(TASKS)


def get_task(name: str, **kwargs: Any) -> Task:
    """A new task object for `name` (keyword arguments go to its constructor, e.g. data_dir=)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {task_names()}")
    return TASKS[name](**kwargs)


def parse_task_spec(spec: str, **kwargs: Any) -> tuple[Task, str | None]:
    """("name" or "name:split") -> (task, split or None); the split is checked against the task's."""
    name, _, split = spec.partition(":")
    task = get_task(name.strip(), **kwargs)
    if not split:
        return task, None
    task.validate_split(split.strip())
    return task, split.strip()
