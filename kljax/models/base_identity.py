"""The identity of a LoRA run's frozen base model, stored in its checkpoints and checked on resume.

Adapters mean nothing without the exact base they were trained on: a checkpoint of a LoRA run
records {"source": the model source, "path": the checkpoint directory it was read from (or None),
"sha256": a content hash}, and a run resumed (or evaluated, exported) on another base is refused.

The hash covers the weight files of a checkpoint directory (each *.safetensors file's name and
bytes, in name order; reading them is the cost) or, for the tiny random model, the parameter
arrays themselves (its weights come from the seed, not from a file).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kljax.errors import UserError
from kljax.models.default import default_model_dir

CHUNK = 1 << 24


def _hash_files(directory: Path) -> str:
    h = hashlib.sha256()
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"model directory {directory} holds no *.safetensors file to identify the LoRA base by")
    for path in files:
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
    return h.hexdigest()


def _hash_arrays(params: Any) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        a = np.asarray(jax.device_get(leaf))
        h.update(jax.tree_util.keystr(path).encode() + str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def base_identity(source: str, params: Any = None) -> dict[str, Any]:
    """{"source", "path", "sha256"} of config.model.source; `params` (the base) only for source "tiny"."""
    if source == "tiny":
        if params is None:
            raise ValueError("base_identity: the tiny model is identified by its parameters; pass them")
        return {"source": source, "path": None, "sha256": _hash_arrays(params)}
    if source == "default":
        path = Path(default_model_dir())
    else:
        path = Path(source)
    return {"source": source, "path": str(path.absolute()), "sha256": _hash_files(path)}


def check_same_base(recorded: dict[str, Any] | None, current: dict[str, Any], where: str) -> None:
    """UserError unless the base recorded in a checkpoint (`where` names it) is the current one."""
    if recorded is None:
        raise UserError(f"{where} records no LoRA base model, but config.model.lora.rank > 0: it is not a LoRA "
                        "checkpoint of this run")
    if recorded.get("sha256") != current["sha256"]:
        was = recorded.get("path") or recorded.get("source")
        now = current["path"] or "a tiny random model"
        raise UserError(f"{where} holds LoRA adapters trained on the base {was} (sha256 "
                        f"{str(recorded.get('sha256'))[:12]}), but config.model.source={current['source']!r} is {now} "
                        f"(sha256 {current['sha256'][:12]}); adapters only apply to the base they were trained on")
