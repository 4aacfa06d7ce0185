"""Checks of a run config that need no model: every field's type against its default's, and the
ranges that a number can mean. Each failure is a UserError naming the field, the value and what is
valid. `kljax.train.config.validate` runs them before anything else.

The defaults are `base()` of configs/kljax_base.py. A field whose default is None (optional) is
not type-checked here; the range checks below cover the numeric ones.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path
from typing import Any

import ml_collections

from kljax.errors import UserError

BASE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "kljax_base.py"
REQUIRED_SECTIONS = ("model", "task", "kl", "rl", "optim", "mesh")


@functools.lru_cache(maxsize=1)
def default_config() -> ml_collections.ConfigDict | None:
    """`base()` of configs/kljax_base.py (None when this installation has no configs/)."""
    if not BASE_CONFIG.is_file():
        return None
    spec = importlib.util.spec_from_file_location("kljax_base_defaults", BASE_CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.base()


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, (dict, ml_collections.ConfigDict)):
        return "section"
    return type(value).__name__


def _article(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _compatible(value: Any, default: Any) -> bool:
    want, got = _kind(default), _kind(value)
    return got == want or (want == "float" and got == "int")


def check_types(config: Any, defaults: Any = None, prefix: str = "config") -> None:
    """Every field of `config` that `defaults` has must have its default's type (an int is a
    float; None on either side is not checked); the sections validate reads must exist."""
    if defaults is None:
        defaults = default_config()
        if defaults is None:
            return
        missing = [s for s in REQUIRED_SECTIONS if s not in config]
        if missing:
            raise UserError(
                f"config has no section(s) {missing}: not a run config? (its fields: {sorted(config.keys())})"
            )
    for key, default in defaults.items():
        if key not in config or default is None or config[key] is None:
            continue
        value, name = config[key], f"{prefix}.{key}"
        if not _compatible(value, default):
            raise UserError(
                f"{name}={value!r} is {_article(_kind(value))}; expected {_article(_kind(default))} "
                f"like the default {default!r}"
            )
        if _kind(default) == "section":
            check_types(value, default, name)


def _number(name: str, value: Any, low: float | None = None, high: float | None = None, *,
            low_open: bool = False, high_open: bool = False, optional: bool = False) -> None:
    """A finite number within the bounds (open or closed), else a UserError saying which."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{name}={value!r} must be a finite number{' (or None)' if optional else ''}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        if low is not None and high is not None:
            where = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            where = f"{'>' if low_open else '>='} {low:g}"
        else:
            where = f"{'<' if high_open else '<='} {high:g}"
        raise UserError(f"{name}={value!r} must be {where}")


def check_ranges(config: Any) -> None:
    """Numbers that cannot be meant: non-finite or out-of-range hyperparameters, seeds, counts."""
    kl, rl, optim = config.kl, config.rl, config.optim
    _number("kl.beta", kl.get("beta"), 0)
    _number("kl.target_kl", kl.get("target_kl"), 0, low_open=True, optional=True)
    _number("kl.truncation", kl.get("truncation"), 0, low_open=True, optional=True)
    if "adapt_horizon" in kl:
        _number("kl.adapt_horizon", kl.adapt_horizon, 0, low_open=True)
    _number("optim.learning_rate", optim.get("learning_rate"), 0, low_open=True)
    _number("optim.b1", optim.get("b1", 0.9), 0, 1, high_open=True)
    _number("optim.b2", optim.get("b2", 0.999), 0, 1, high_open=True)
    _number("optim.eps", optim.get("eps", 1e-8), 0, low_open=True)
    _number("optim.weight_decay", optim.get("weight_decay", 0.0), 0)
    _number("optim.end_lr_fraction", optim.get("end_lr_fraction", 0.0), 0, 1)
    _number("optim.max_grad_norm", optim.get("max_grad_norm"), 0, low_open=True, optional=True)
    _number("rl.clip_low", rl.get("clip_low"), 0, 1, high_open=True, optional=True)
    _number("rl.clip_high", rl.get("clip_high"), 0, optional=True)
    _number("rl.temperature", rl.get("temperature", 1.0), 0)
    seed = config.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise UserError(f"config.seed={seed!r} must be an integer in [0, 2**31)")
    for name in ("eval_examples",):
        if name in config and not (isinstance(config[name], int) and config[name] >= 1):
            raise UserError(f"config.{name}={config[name]!r} must be an integer >= 1")
    for name, zero in (("eval_every", "off"), ("log_samples_every", "off"), ("eval_samples", "greedy only"),
                       ("eval_examples_ood", "eval_examples")):
        if name in config and not (isinstance(config[name], int) and config[name] >= 0):
            raise UserError(f"config.{name}={config[name]!r} must be an integer >= 0 (0: {zero})")
    if "log_samples_n" in config and not (_is_int(config.log_samples_n) and config.log_samples_n >= 1):
        raise UserError(f"config.log_samples_n={config.log_samples_n!r} must be an integer >= 1 (prompts logged "
                        "each time; config.log_samples_every=0 turns logging off)")
    _check_split_list(config.task.get("eval_splits", ""))
    _check_tiny_model(config.model)
    from kljax.models.config import DTYPES, REMAT_POLICIES

    for name, valid in (("dtype", DTYPES), ("param_dtype", DTYPES), ("remat", REMAT_POLICIES)):
        if name in config.model and config.model[name] not in valid:
            raise UserError(f"config.model.{name}={config.model[name]!r} is not valid; choose one of {list(valid)}")
    for axis in ("data", "fsdp", "tensor"):
        size = config.mesh.get(axis, 1)
        if isinstance(size, bool) or not isinstance(size, int) or not (size >= 1 or size == -1):
            raise UserError(f"config.mesh.{axis}={size!r} must be a positive integer or -1 (the rest)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_split_list(value: Any) -> None:
    """task.eval_splits: "" (no evaluation) or comma-separated split names, none of them empty."""
    if not isinstance(value, str):
        return  # check_types names the type
    if value.strip() and any(not part.strip() for part in value.split(",")):
        raise UserError(f"config.task.eval_splits={value!r} has an empty split name; give comma-separated split "
                        "names, e.g. 'test,ood_digits', or '' for the task's own evaluation splits")


TINY_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "max_position_embeddings")


def _check_tiny_model(model: Any) -> None:
    """config.model.tiny's sizes: positive integers, num_heads a multiple of num_kv_heads."""
    tiny = model.get("tiny") if hasattr(model, "get") else None
    if tiny is None:
        return
    for name in TINY_SIZES:
        if name in tiny and not (_is_int(tiny[name]) and tiny[name] >= 1):
            raise UserError(f"config.model.tiny.{name}={tiny[name]!r} must be an integer >= 1")
    heads, kv = tiny.get("num_heads"), tiny.get("num_kv_heads")
    if _is_int(heads) and _is_int(kv) and heads % kv:
        raise UserError(f"config.model.tiny.num_heads={heads} must be a multiple of "
                        f"config.model.tiny.num_kv_heads={kv}")
    std = tiny.get("init_std")
    if std is not None:
        _number("config.model.tiny.init_std", std, 0, low_open=True)
