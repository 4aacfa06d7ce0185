"""Reward models: HF `*ForSequenceClassification` checkpoints (Llama, Qwen2, Qwen3) scored in JAX.

    rm = load_reward_model(DIR, mesh=mesh)          # backbone params (sharded), config, score head
    scores_b = reward_scores(rm.params, rm.score, tokens_bt, mask_bt, config=rm.config)

The backbone is converted with `kljax.models.convert`'s key table (the causal-LM rules minus the
LM head); `score.weight` [1, D] is the head. A sequence's score is the head applied to the final
hidden state of its last non-padding token, as transformers does; only single-label models
(num_labels 1) are supported.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.models.convert import IGNORED_KEYS, RULES, hf_shape, open_checkpoint, read_hf_config, to_kljax
from kljax.parallel import sharding as sharding_lib

SEQUENCE_CLASSIFIERS = {
    "LlamaForSequenceClassification": "LlamaForCausalLM",
    "Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
    "Qwen3ForSequenceClassification": "Qwen3ForCausalLM",
}
SCORE_KEY = "score.weight"


@dataclasses.dataclass
class RewardModel:
    """Backbone params (no LM head), its config, and the score head [D, 1] (float32)."""

    params: Any
    config: ModelConfig
    score: jax.Array


def reward_model_config(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
    """The backbone's ModelConfig of a sequence-classification config.json (ValueError for other kinds)."""
    archs = list(hf.get("architectures") or [])
    if len(archs) != 1 or archs[0] not in SEQUENCE_CLASSIFIERS:
        raise ValueError(f"reward model architecture {archs!r} is not supported; supported: "
                         f"{sorted(SEQUENCE_CLASSIFIERS)}")
    labels = int(hf.get("num_labels", len(hf.get("id2label") or {}) or 1))
    if labels != 1:
        raise ValueError(f"reward model has num_labels={labels}; only single-score models (num_labels=1) are supported")
    backbone = {**hf, "architectures": [SEQUENCE_CLASSIFIERS[archs[0]]], "tie_word_embeddings": True}
    return ModelConfig.from_hf(backbone, **overrides)


def load_reward_model(model_dir: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None,
                      **overrides: Any) -> RewardModel:
    """Read a sequence-classification checkpoint; with `mesh`, each parameter goes to its NamedSharding
    (as the policy's and the reference's do). Every key and shape is checked before a weight is read."""
    config = reward_model_config(read_hf_config(model_dir), **overrides)
    files = open_checkpoint(model_dir)
    by_path = {r.path: r for r in RULES}
    plan = []
    for path, shape in tfm.param_paths(config).items():
        rule = by_path[path]
        per = shape[1:] if rule.layered else shape
        keys = [rule.hf.format(i=i) for i in range(config.num_layers)] if rule.layered else [rule.hf]
        plan.append((rule, per, keys))
    expected = {k: hf_shape(rule, per) for rule, per, keys in plan for k in keys}
    expected[SCORE_KEY] = (1, config.hidden_size)
    missing = [k for k in expected if k not in files]
    extra = [k for k in files if k not in expected and not any(p.match(k) for p in IGNORED_KEYS)]
    if missing or extra:
        raise ValueError(f"reward model {model_dir}: missing tensors {missing[:8]}, unexpected tensors {extra[:8]}")
    for key, shape in expected.items():
        if files[key].shape(key) != shape:
            raise ValueError(f"reward model {model_dir}: tensor {key} has shape {files[key].shape(key)}, "
                             f"expected {shape}")
    shardings = None
    if mesh is not None:
        shardings = sharding_lib.logical_to_sharding(tfm.logical_axes(config), tfm.param_shapes(config), mesh)
    dtype = np.dtype(config.jnp_param_dtype)
    params: dict[str, Any] = {}
    for rule, per, keys in plan:
        host = np.stack([to_kljax(rule, files[k].get(k), per) for k in keys]) if rule.layered else \
            to_kljax(rule, files[keys[0]].get(keys[0]), per)
        host = np.asarray(host, dtype)
        node_sh = shardings
        if node_sh is not None:
            for k in rule.path:
                node_sh = node_sh[k]
        value = jax.device_put(host) if node_sh is None else sharding_lib.device_put_host(host, node_sh)
        node = params
        for k in rule.path[:-1]:
            node = node.setdefault(k, {})
        node[rule.path[-1]] = value
    score = np.asarray(files[SCORE_KEY].get(SCORE_KEY), np.float32).T  # [D, 1]
    score = jax.device_put(score) if mesh is None else jax.device_put(score, sharding_lib.replicated(mesh))
    return RewardModel(params, config, score)


@partial(jax.jit, static_argnames="config")
def reward_scores(params: Any, score_d1: jax.Array, tokens_bt: jax.Array, mask_bt: jax.Array, *,
                  config: ModelConfig) -> jax.Array:
    """Float32 scores [B]: the head on the hidden state of each row's last non-padding token."""
    hidden, _ = tfm.forward_hidden(params, tokens_bt, mask_bt, None, config)
    t = tokens_bt.shape[1]
    last = jnp.argmax(jnp.arange(t)[None, :] * mask_bt.astype(jnp.int32), axis=1)
    h_bd = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    return (h_bd @ score_d1)[:, 0]
