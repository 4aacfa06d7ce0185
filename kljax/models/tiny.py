"""Tiny random Hugging Face models of each supported family, for tests (needs torch + transformers).

`save_tiny_hf_model(family, out_dir)` builds one with transformers, gives every tensor (norms and
biases included) random values so nothing is trivially 0 or 1, and saves it with `save_pretrained`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_BASE: dict[str, Any] = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
)
TINY_FAMILIES: dict[str, dict[str, Any]] = {
    # Llama 3.x: llama3 rope scaling, untied embeddings.
    "llama3": dict(_BASE, model_type="llama", tie_word_embeddings=False, rope_scaling={
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }),
    # SmolLM2-like Llama: tied embeddings; attention_bias=True also exercises q/k/v/o biases.
    "llama_tied": dict(_BASE, model_type="llama", tie_word_embeddings=True, attention_bias=True,
                       num_key_value_heads=1),
    # Qwen2 / Qwen2.5: q/k/v bias, tied.
    "qwen2": dict(_BASE, model_type="qwen2", tie_word_embeddings=True),
    # Qwen3: per-head q/k RMSNorm, head_dim 16 != hidden 32 / 4 heads, untied.
    "qwen3": dict(_BASE, model_type="qwen3", head_dim=16, tie_word_embeddings=False),
}


def tiny_hf_model(family: str, seed: int = 0):
    """A float32 transformers model of `family` with every parameter randomized."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; valid: {sorted(TINY_FAMILIES)}")
    kwargs = dict(TINY_FAMILIES[family])
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.15 * noise)
    return model


def save_tiny_hf_model(family: str, out_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny random `family` model (config.json + model.safetensors) to `out_dir`."""
    model = tiny_hf_model(family, seed)
    model.save_pretrained(out_dir)
    return Path(out_dir)
