"""Reward functions: the user's own (callables, `module.path:fn`, `file.py:fn`) and built-in verifiers,
called the way TRL's `GRPOTrainer` calls them: batched, by keyword (the arguments: `CALL_NAMES`),

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list[float | None]

A function that takes `**kwargs` gets all of them; one without gets only the names it declares. Each name it
requires must be among them: `check_signature` says which is not, before any model loads. A value None
means "no score for this sample" (it is left out of the weighted sum); an `async def` function is awaited.
Every call gets its own copies of the arguments.

Built-ins, named without a colon:
    math_answer    1.0 when math-verify finds the final answer equivalent to `answer` (worker pool, time limit)
    exact_match    1.0 when the final answer equals `answer` (integers numerically, else as text)
    format         1.0 when the completion states a final answer (\\boxed{...} or "Answer: ...")
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kljax.tasks import answers
from kljax.tasks.files import answer_matches
from kljax.tasks.pool import default_pool
from kljax.tasks.rewards import check_math

RewardFn = Callable[..., Any]
# The keywords of a call, as in TRL, besides every other column of the rows (`answer` always), lists aligned
# with the batch:
#   prompts         one per completion: the prompt as written (standard data), or its message list
#                   [{"role", "content"}, ...] (conversational data)
#   completions     the sampled text, or [{"role": "assistant", "content": text}] for conversational data
#   completion_ids  the sampled token ids (list[int] each, up to the stop token)
#   trainer_state   a `TrainerState`: global_step (also `.step`), epoch (passes over the training rows so
#                   far), max_steps
#   log_metric, log_extra   TRL's logging hooks (`log_metric(name, value)` adds the step's mean of its
#                   values under `name`, as TRL does; `log_extra` is accepted and not recorded)
#   trainer_state is the callbacks' `transformers.TrainerState` when RLTrainer has callbacks
CALL_NAMES = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # row columns TRL does not pass (the prompt is `prompts`)


@dataclasses.dataclass(frozen=True)
class TrainerState:
    """What TRL's `trainer_state` argument offers a reward function: the 0-based step being rewarded,
    the passes over the training rows so far, and the run's length."""

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int = 0

    @property
    def step(self) -> int:
        return self.global_step


def _text(completion: Any) -> str:
    """The text of a standard or conversational completion."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return completion if isinstance(completion, str) else ""


def math_answer(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """math-verify equivalence of each final answer with `answer`, in the verifier pool (time limit per item)."""

    items = [(_text(c), str(a)) for c, a in zip(completions, answer, strict=True)]
    return [float(o.value.reward) if o.ok else 0.0 for o in default_pool().map(check_math, items)]


def exact_match(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the final answer equals `answer` (see `kljax.tasks.files.answer_matches`)."""

    return [float(answer_matches(_text(c), str(a))) for c, a in zip(completions, answer, strict=True)]


def format_reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
    """1.0 when the completion states a final answer in \\boxed{} or an "Answer:" line."""
    return [float(answers.has_answer_marker(_text(c))) for c in completions]


BUILTINS: dict[str, RewardFn] = {"math_answer": math_answer, "exact_match": exact_match, "format": format_reward}


@dataclasses.dataclass(frozen=True)
class RewardRef:
    """A picklable reference to a reward function, resolved (and cached) in whichever process calls it,
    so it also runs in `VerifierPool` workers: `spec` is a built-in name, `module.path:fn` or
    `FILE.py:fn` (the file's absolute path); a callable given as an object travels as `payload`
    (cloudpickle: functions of `__main__` and notebooks by value), `spec` then only names it."""

    spec: str
    payload: bytes | None = None

    @property
    def name(self) -> str:
        return self.spec.rpartition(":")[2]

    def resolve(self) -> RewardFn:
        return _unpickle(self.payload) if self.payload is not None else resolve(self.spec)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


def callable_ref(fn: RewardFn) -> RewardRef:
    """A RewardRef that carries `fn` itself to worker processes (ValueError saying what to do when it cannot)."""
    label = f"{getattr(fn, '__module__', None) or '?'}:{function_name(fn)}"
    try:
        import cloudpickle
    except ImportError:
        raise ValueError(f"reward function {label}: reward.timeout_s runs reward functions in worker processes, "
                         "which needs the `cloudpickle` package for a function object; install it, or pass the "
                         "function as 'file.py:fn'") from None
    try:
        payload = cloudpickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - whatever it captured cannot be copied to another process
        raise ValueError(f"reward function {label} cannot be sent to the reward worker processes that "
                         f"reward.timeout_s uses ({type(e).__name__}: {e}); define it at module level in a file "
                         "and pass 'file.py:fn', or leave reward.timeout_s unset") from None
    return RewardRef(label, payload)


@functools.lru_cache(maxsize=64)
def _unpickle(payload: bytes) -> RewardFn:
    import pickle

    return pickle.loads(payload)


def function_name(fn: Any) -> str:
    """The name a reward function's metrics go under (`rewards/NAME/mean`, TRL's: its __name__)."""
    if isinstance(fn, RewardRef):
        return fn.name
    if isinstance(fn, functools.partial):
        return function_name(fn.func)
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def is_user_code(fn: Any) -> bool:
    """Whether `fn` is the user's code (not a built-in): it runs in the worker pool when reward.timeout_s is set."""
    return not (isinstance(fn, RewardRef) and fn.payload is None and ":" not in fn.spec) and \
        getattr(fn, "spec", None) != "reward.model"


def parse_specs(text: str, load: bool = True) -> list[RewardRef]:
    """"a.py:fn,pkg.mod:fn,format" -> RewardRefs (files made absolute; each loaded now unless `load` is
    False, e.g. to load it in a worker process within the time limit)."""
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
        if load:
            resolve(spec)
        refs.append(RewardRef(spec))
    return refs


@functools.cache
def resolve(spec: str) -> RewardFn:
    """The callable `spec` names (see `RewardRef`); ValueError when it cannot be loaded (an import that
    raises or calls sys.exit included)."""
    if ":" not in spec:
        if spec not in BUILTINS:
            raise ValueError(f"unknown built-in reward {spec!r}; valid: {sorted(BUILTINS)}")
        return BUILTINS[spec]
    target, _, attr = spec.rpartition(":")
    if target == "__main__" and "__main__" in sys.modules and hasattr(sys.modules["__main__"], attr):
        return getattr(sys.modules["__main__"], attr)
    try:
        if target.endswith(".py"):
            name = f"kljax_reward_{abs(hash(target)):x}"
            module = sys.modules.get(name)
            if module is None:
                file_spec = importlib.util.spec_from_file_location(name, target)
                module = importlib.util.module_from_spec(file_spec)
                sys.modules[name] = module
                file_spec.loader.exec_module(module)
        elif target == "__main__":
            raise ValueError("a function of the running script (__main__) exists only in that process; pass the "
                             "function object to kljax.RLTrainer, or 'file.py:fn'")
        else:
            module = importlib.import_module(target)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's import, reported with its spec
        sys.modules.pop(f"kljax_reward_{abs(hash(target)):x}", None)
        raise ValueError(f"reward function {spec!r}: could not import {target!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        found = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"reward function {spec!r}: {target!r} has no function {attr!r} (it has {found}); a "
                         "function object made by a factory, a closure or a lambda is recorded by its name only: "
                         "rerun from Python with reward_funcs=[the object] and config='RUN/config.json', or write "
                         "it in a file and give 'file.py:fn'")
    return fn


# ------------------------------------------------------------------ signatures, bound before the model loads


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a reward function accepts (picklable: described in a worker when its import must be timed)."""

    names: tuple[str, ...]  # parameters that can be passed by keyword
    required: tuple[str, ...]  # of those, the ones without a default
    positional_only: tuple[str, ...]  # required parameters that cannot be passed by keyword
    var_keyword: bool


def signature_of(fn: Any) -> Signature:
    """The Signature of `fn` (a RewardRef is resolved first: in a worker, within the time limit)."""
    fn = fn.resolve() if isinstance(fn, RewardRef) else fn
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: assume it takes everything
        return Signature((), (), (), True)
    kw = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return Signature(
        names=tuple(p.name for p in kw),
        required=tuple(p.name for p in kw if p.default is p.empty),
        positional_only=tuple(p.name for p in params if p.kind == p.POSITIONAL_ONLY and p.default is p.empty),
        var_keyword=any(p.kind == p.VAR_KEYWORD for p in params),
    )


def check_signature(name: str, spec: str, sig: Signature, columns: Sequence[str]) -> tuple[str, ...]:
    """The keywords `fn` will be called with, out of CALL_NAMES and the data's `columns`; a ValueError
    naming the function and the parameter when it requires one that no call provides."""
    available = list(CALL_NAMES) + [c for c in columns if c not in CALL_NAMES]
    offered = f"it is called with {', '.join(CALL_NAMES[:4])} and the data's columns {sorted(columns)}"
    if sig.positional_only:
        raise ValueError(f"reward function {name!r} ({spec}): parameter(s) {list(sig.positional_only)} are "
                         f"positional-only, but reward functions are called by keyword; {offered}")
    missing = [p for p in sig.required if p not in available]
    if missing:
        raise ValueError(f"reward function {name!r} ({spec}) requires parameter(s) {missing} that no call "
                         f"provides; {offered}")
    if "completions" not in sig.names and not sig.var_keyword:
        raise ValueError(f"reward function {name!r} ({spec}) takes no `completions` parameter (nor **kwargs); "
                         f"{offered}")
    return tuple(available) if sig.var_keyword else tuple(n for n in sig.names if n in available)


def call(fn: Any, kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)`, awaited when it is a coroutine; a numpy array comes back as a list."""
    fn = fn.resolve() if isinstance(fn, RewardRef) else fn
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        out = _await(out)
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()
    return out


def _await(awaitable: Any) -> Any:
    async def main() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1) as ex:  # a notebook's loop is running: use another thread
        return ex.submit(asyncio.run, main()).result()
