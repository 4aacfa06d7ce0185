"""LoRA adapters as a PEFT adapter directory: adapter_config.json + adapter_model.safetensors.

`peft.PeftModel.from_pretrained(base, DIR)` loads it onto the base HF model and gives the same
logits as kljax's adapted model (tests/test_lora_export.py). The layout, per layer i and target t
(`kljax.models.lora`: A [L, in..., r], B [L, r, out...], HF weight W [out, in] with y = x W^T):

    base_model.model.model.layers.{i}.{module}.lora_A.weight = A[i].reshape(in, r).T    [r, in]
    base_model.model.model.layers.{i}.{module}.lora_B.weight = B[i].reshape(r, out).T   [out, r]

and PEFT's scale lora_alpha / r is kljax's alpha / rank (no rsLoRA, no dropout, no bias).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kljax.models.config import ModelConfig
from kljax.models.lora import HF_MODULES

PREFIX = "base_model.model.model.layers.{i}."


def peft_tensors(params: Any, model: ModelConfig) -> dict[str, np.ndarray]:
    """{PEFT key: float32 [r, in] or [out, r] array} of the adapters in `params` (the adapter tree or
    the combined base + adapters tree)."""
    lora = model.lora
    layers = params["layers"]
    out = {}
    for t in lora.targets:
        a = np.asarray(jax.device_get(layers[f"{t}_lora_a"]), np.float32)
        b = np.asarray(jax.device_get(layers[f"{t}_lora_b"]), np.float32)
        for i in range(model.num_layers):
            key = PREFIX.format(i=i) + HF_MODULES[t]
            out[key + ".lora_A.weight"] = np.ascontiguousarray(a[i].reshape(-1, lora.rank).T)
            out[key + ".lora_B.weight"] = np.ascontiguousarray(b[i].reshape(lora.rank, -1).T)
    return out


def adapter_config(model: ModelConfig, base_path: str | None) -> dict[str, Any]:
    """PEFT's adapter_config.json for `model.lora`."""
    lora = model.lora
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path,
        "r": lora.rank, "lora_alpha": float(lora.alpha), "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(HF_MODULES[t].split(".")[-1] for t in lora.targets),
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
        "init_lora_weights": True, "inference_mode": True,
    }


def write_peft_adapter(params: Any, model: ModelConfig, out_dir: str | os.PathLike, base_path: str | None) -> Path:
    """Write the PEFT adapter directory `out_dir` (new or empty; the caller makes it atomic)."""
    from safetensors.numpy import save_file

    if model.lora is None:
        raise ValueError("this run has no LoRA adapters (model.lora.rank is 0): export the full model instead")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} exists and is not empty")
    tensors = peft_tensors(params, model)
    if jax.process_index() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
        (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config(model, base_path), indent=2) + "\n")
    return out_dir
