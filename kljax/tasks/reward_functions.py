"""Reward functions named in a config: the user's own (`module.path:fn`, `file.py:fn`) and built-in verifiers.

A reward function is batched, as in TRL:

    fn(prompts: list[str], completions: list[str], **columns) -> list[float]

`prompts[i]` is example i's prompt (after task.prompt_template, before any chat template),
`completions[i]` the sampled text, and each keyword a column of the rows (lists aligned with the
batch; `answer` is always there). A function should accept `**kwargs` for the columns it ignores.

Built-ins, named without a colon:
    math_answer    1.0 when math-verify finds the final answer equivalent to `answer` (worker pool, time limit)
    exact_match    1.0 when the final answer equals `answer` (integers numerically, else as text)
    format         1.0 when the completion states a final answer (\\boxed{...} or "Answer: ...")
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kljax.tasks import answers

RewardFn = Callable[..., Any]


def math_answer(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """math-verify equivalence of each final answer with `answer`, in the verifier pool (time limit per item)."""
    from kljax.tasks.pool import default_pool
    from kljax.tasks.rewards import check_math

    outcomes = default_pool().map(check_math, list(zip(completions, [str(a) for a in answer], strict=True)))
    return [float(o.value.reward) if o.ok else 0.0 for o in outcomes]


def exact_match(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the final answer equals `answer` (see `kljax.tasks.files.answer_matches`)."""
    from kljax.tasks.files import answer_matches

    return [float(answer_matches(c, str(a))) for c, a in zip(completions, answer, strict=True)]


def format_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 when the completion states a final answer in \\boxed{} or an "Answer:" line."""
    return [float(answers.has_answer_marker(c)) for c in completions]


BUILTINS: dict[str, RewardFn] = {"math_answer": math_answer, "exact_match": exact_match, "format": format_reward}


@dataclasses.dataclass(frozen=True)
class RewardRef:
    """A picklable reference to a reward function: resolved (and cached) in whichever process calls it,
    so it also runs in `VerifierPool` workers. `spec` is a built-in name, `module.path:fn` or `FILE.py:fn`
    (the file's absolute path)."""

    spec: str

    @property
    def name(self) -> str:
        return self.spec.rpartition(":")[2]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return resolve(self.spec)(*args, **kwargs)


def parse_specs(text: str) -> list[RewardRef]:
    """"a.py:fn,pkg.mod:fn,format" -> RewardRefs (files made absolute; each checked to load now)."""
    refs = []
    for spec in filter(None, (s.strip() for s in str(text or "").split(","))):
        if ":" in spec:
            target, _, fn = spec.rpartition(":")
            if target.endswith(".py"):
                path = Path(target).expanduser()
                if not path.is_file():
                    raise ValueError(f"reward.functions: file {target!r} (in {spec!r}) does not exist")
                spec = f"{path.resolve()}:{fn}"
        elif spec not in BUILTINS:
            raise ValueError(f"reward.functions: {spec!r} is neither a built-in {sorted(BUILTINS)} nor "
                             "module.path:fn or file.py:fn")
        resolve(spec)
        refs.append(RewardRef(spec))
    return refs


@functools.cache
def resolve(spec: str) -> RewardFn:
    """The callable `spec` names (see `RewardRef`); ValueError when it cannot be loaded."""
    if ":" not in spec:
        if spec not in BUILTINS:
            raise ValueError(f"unknown built-in reward {spec!r}; valid: {sorted(BUILTINS)}")
        return BUILTINS[spec]
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            name = f"kljax_reward_{abs(hash(target)):x}"
            module = sys.modules.get(name)
            if module is None:
                file_spec = importlib.util.spec_from_file_location(name, target)
                module = importlib.util.module_from_spec(file_spec)
                sys.modules[name] = module
                file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as e:  # noqa: BLE001 - an import error in the user's file, reported with its spec
        sys.modules.pop(f"kljax_reward_{abs(hash(target)):x}", None)
        raise ValueError(f"reward function {spec!r}: could not import {target!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        found = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"reward function {spec!r}: {target!r} has no function {attr!r}; it has {found}")
    return fn
