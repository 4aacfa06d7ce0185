"""A converted model on disk for kljax: orbax params plus the HF config.json and tokenizer files.

    DIR/params/         orbax StandardCheckpointer tree of the kljax params
    DIR/config.json     the HF config.json (so the model can be exported back unchanged)
    DIR/tokenizer*...   tokenizer files copied from the HF directory, when it had them
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax

from kljax.errors import UserError
from kljax.models.config import ModelConfig
from kljax.models.convert import TOKENIZER_FILES, model_config_from_dir
from kljax.models.transformer import Params, logical_axes, param_shapes
from kljax.parallel import sharding as sharding_lib


def is_orbax_model(model_dir: str | os.PathLike) -> bool:
    """True for a directory written by `save_orbax_model`."""
    return (Path(model_dir) / "params").is_dir() and (Path(model_dir) / "config.json").is_file()


def save_orbax_model(
    out_dir: str | os.PathLike,
    params: Params,
    hf_config: dict[str, Any],
    tokenizer_dir: str | os.PathLike | None = None,
) -> Path:
    """Write params with orbax, and the HF config and tokenizer files beside them."""
    import orbax.checkpoint as ocp

    out_dir = Path(out_dir).absolute()
    if (out_dir / "params").exists():
        raise ValueError(f"{out_dir}/params already exists; choose a new output directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(out_dir / "params", params)
    checkpointer.wait_until_finished()
    if jax.process_index() == 0:
        config = {k: v for k, v in hf_config.items() if k != "quantization_config"}
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copy2(Path(tokenizer_dir) / name, out_dir / name)
    return out_dir


def load_orbax_model(
    model_dir: str | os.PathLike,
    *,
    mesh: jax.sharding.Mesh | None = None,
    **overrides: Any,
) -> tuple[Params, ModelConfig]:
    """Restore (params, config); on `mesh` each parameter lands on its logical sharding."""
    import orbax.checkpoint as ocp

    model_dir = Path(model_dir).absolute()
    config = model_config_from_dir(model_dir, **overrides)
    shapes = param_shapes(config)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, shapes)
    else:
        shardings = sharding_lib.logical_to_sharding(logical_axes(config), shapes, mesh)
    abstract = lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)
    target = jax.tree.map(abstract, shapes, shardings)
    try:
        params = ocp.StandardCheckpointer().restore(model_dir / "params", target)
    except Exception as e:  # orbax and tensorstore raise many types for missing or damaged files
        raise UserError(f"{model_dir / 'params'} cannot be restored: {type(e).__name__}: {e}") from e
    return params, config
