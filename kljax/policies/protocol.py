"""The policy protocol: what the rollout and the train step need from a model, and nothing more.

A policy model is a static, hashable description (it is a jit static argument) with two methods:
  teacher_forced(params, tokens_bs, mask_bs, positions_bs, response_len, ...) -> dict of [B, R] arrays:
      "logp" log pi(y_r | everything before it) of the last `response_len` tokens (float32 or wider),
      "entropy" (with entropy=True), "ref_logp" pi_ref's (with ref_logp=True),
      "full_kl" KL(pi(.|h_r) || pi_ref(.|h_r)) (with full_kl=True); every distribution is the
      model's logits divided by `temperature` (the tempered policy a sampler at that temperature draws from).
  sample(params, prompt_tokens_bp, prompt_mask_bp, key, sampling, mesh=None) -> `sampling.SampleResult`.
`kljax.policies.transformer.TransformerPolicy` (any `ModelConfig`) and
`kljax.policies.tabular.TabularPolicy` (one logit row per prefix, exactly enumerable) implement it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.policies.transformer import TransformerPolicy

Array = jax.Array


@runtime_checkable
class PolicyModel(Protocol):
    def teacher_forced(
        self, params: Any, tokens_bs: Array, mask_bs: Array, positions_bs: Array, response_len: int, *,
        ref_params: Any = None, entropy: bool = False, full_kl: bool = False, chunk: int = 256,
        layers_grad_acc: Any = None, ref_logp: bool = False, temperature: float = 1.0,
    ) -> dict[str, Array]: ...

    def sample(self, params: Any, prompt_tokens_bp: Any, prompt_mask_bp: Any, key: Array, sampling: Any,
               mesh: Any = None) -> Any: ...


def frozen_copy(params: Any, model: Any) -> Any:
    """A copy in new buffers of parameters only forward passes read (the reference, the async
    sampler's snapshots): `transformer.frozen_copy` for a `ModelConfig` (its frozen dtype), else the
    same arrays copied."""
    if isinstance(model, ModelConfig):
        return tfm.frozen_copy(params, model)
    return jax.tree.map(jax.numpy.copy, params)


def as_policy(model: Any) -> PolicyModel:
    """A `ModelConfig` becomes its `TransformerPolicy`; a policy model is returned as is."""
    if isinstance(model, ModelConfig):
        return TransformerPolicy(model)
    if not isinstance(model, PolicyModel):
        raise TypeError(f"{type(model).__name__} is not a policy model (needs teacher_forced and sample)")
    return model
