"""The checks of `RLTrainer`'s arguments where they enter: each bad value is one UserError naming the
argument, the value's type and what is accepted. And the model argument: a name, a checkpoint
directory, or a kljax run, whose latest checkpoint is exported to WORKDIR/init_model when training
starts (not in the constructor, which writes nothing).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kljax.config.sections import MODEL_SOURCES
from kljax.errors import UserError
from kljax.train.export import export_run, is_run_workdir
from kljax.train.trainer import RESUME_MODES

WHERE = "RLTrainer"


def _type(value: Any) -> str:
    return type(value).__name__


def new_run_dir() -> Path:
    """A fresh path under the temporary directory for a run given no workdir (made when it trains)."""
    return Path(tempfile.gettempdir()) / f"kljax-run-{uuid.uuid4().hex[:10]}"


def check_workdir(workdir: Any) -> Path:
    if not isinstance(workdir, (str, os.PathLike)) or not str(os.fspath(workdir)).strip():
        what = "an empty string" if workdir == "" else f"a {_type(workdir)}"
        raise UserError(f"{WHERE}: workdir={workdir!r} is {what}; give a directory path for the run's files")
    return Path(workdir)


def check_resume(resume: Any) -> bool | str:
    if isinstance(resume, bool) or resume in RESUME_MODES:
        return resume
    raise UserError(f"{WHERE}: resume={resume!r} is not valid; give False, True or one of {list(RESUME_MODES)}")


def check_reward_funcs(funcs: Any) -> list[Any] | None:
    """None, or a list of callables and spec strings (one callable or string is a list of one)."""
    if funcs is None:
        return None
    if callable(funcs) or isinstance(funcs, str):
        funcs = [funcs]
    if not isinstance(funcs, Sequence) or isinstance(funcs, (bytes, Mapping)):
        raise UserError(f"{WHERE}: reward_funcs={funcs!r} is a {_type(funcs)}; give a callable, a spec string "
                        "('module:fn', 'file.py:fn', a built-in name) or a list of them")
    for f in funcs:
        if not (callable(f) or (isinstance(f, str) and f.strip())):
            raise UserError(f"{WHERE}: reward_funcs holds {f!r}, a {_type(f)}; each must be a callable or a spec "
                            "string ('module:fn', 'file.py:fn', or math_answer, exact_match, format)")
    return list(funcs)


def check_weights(weights: Any, funcs: list[Any] | None) -> list[float]:
    """One finite number per reward function."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise UserError(f"{WHERE}: reward_weights={weights!r} is a {_type(weights)}; give a list of numbers, one per "
                        "reward function (e.g. [1.0, 0.5])")
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(float(w)):
            raise UserError(f"{WHERE}: reward_weights holds {w!r}, a {_type(w)}; each weight must be a finite number")
    if funcs is not None and len(weights) != len(funcs):
        raise UserError(f"{WHERE}: reward_weights has {len(weights)} values for {len(funcs)} reward functions")
    return [float(w) for w in weights]


def check_overrides(overrides: Any) -> list[str]:
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence):
        raise UserError(f"{WHERE}: overrides={overrides!r} is a {_type(overrides)}; give a list of "
                        "'--config.field=value' strings or a dict of fields")
    return list(overrides)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """config.model.source for the model argument; `run`: a kljax run to start from, exported to
    `source` (WORKDIR/init_model) by `prepare` when training starts."""

    source: str
    run: Path | None = None

    def prepare(self, workdir: Path, resuming: bool) -> None:
        if self.run is None or (resuming and Path(self.source).is_dir()):  # a resumed run keeps its copy
            return
        print(f"kljax train: starting from run {self.run}: its latest checkpoint exported to {self.source}",
              flush=True)
        export_run(self.run, self.source, overwrite=True)


def model_source(model: Any, workdir: Path) -> ModelSource | None:
    if model is None:
        return None
    if not isinstance(model, (str, os.PathLike)):
        raise UserError(f"{WHERE}: model={model!r} is a {_type(model)}; give 'tiny', 'default', a Hugging Face "
                        "checkpoint directory or a kljax run directory")
    text = str(model)
    if text in MODEL_SOURCES:
        return ModelSource(text)
    path = Path(text).expanduser()
    if not path.is_dir():
        raise UserError(f"{WHERE}: model={text!r} is neither 'tiny', 'default' nor a directory (an HF checkpoint "
                        "or a kljax run)")
    if is_run_workdir(path):
        return ModelSource(str(workdir / "init_model"), run=path)
    return ModelSource(str(path))



def check_model_source(source: str) -> None:
    """config.model.source names a model kljax knows or an existing directory."""
    if source not in MODEL_SOURCES and not Path(source).is_dir():
        raise UserError(f"config.model.source={source!r} is neither one of {list(MODEL_SOURCES)} nor a checkpoint "
                        "directory")
