"""The transformer as a policy model (`kljax.policies.protocol`): teacher-forced response log-probs,
entropy and full-vocabulary KL from one forward pass, and the KV-cache sampler.

Sequences are prompt + response, `tokens_bs` [B, S] with the response in the last R positions. The
log-prob of response token r comes from the hidden state at position S - R - 1 + r, so only [B, R]
positions are ever projected to the vocabulary, in chunks (`transformer.logprobs_from_hidden`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from kljax import sampling as sampling_lib
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.rl.estimators import full_kl_from_logits

Array = jax.Array


def response_hidden(
    params: Any, tokens_bs: Array, mask_bs: Array, positions_bs: Array, response_len: int, model: ModelConfig,
    layers_grad_acc: Any = None,
) -> Array:
    """Hidden states that predict the response tokens: positions S - R - 1 .. S - 2, [B, R, D].
    `layers_grad_acc`: see `transformer.forward_hidden`."""
    hidden_bsd, _ = tfm.forward_hidden(params, tokens_bs, mask_bs, positions_bs, model,
                                       layers_grad_acc=layers_grad_acc)
    s = tokens_bs.shape[1]
    return hidden_bsd[:, s - response_len - 1 : s - 1]


def response_logprobs(
    params: Any, tokens_bs: Array, mask_bs: Array, positions_bs: Array, response_len: int, model: ModelConfig,
    chunk: int = 256, with_entropy: bool = False,
) -> Array | tuple[Array, Array]:
    """log p(response token r | everything before it), [B, R] float32 (and entropy [B, R])."""
    hidden = response_hidden(params, tokens_bs, mask_bs, positions_bs, response_len, model)
    return tfm.logprobs_from_hidden(
        params, hidden, tokens_bs[:, -response_len:], model, chunk_size=chunk, with_entropy=with_entropy
    )


def full_kl_from_hidden(
    params: Any, ref_params: Any, hidden_brd: Array, ref_hidden_brd: Array, model: ModelConfig, chunk: int = 256,
    temperature: float = 1.0,
) -> Array:
    """KL(pi(.|h_r) || pi_ref(.|h_r)) over the whole vocabulary at each response position, [B, R],
    both models' logits divided by `temperature`.

    Both models' logits are formed one [B, chunk, V] slice at a time (`lax.map` under
    `jax.checkpoint`), so the [B, R, V] logits never exist. Differentiable in `params` (the
    reference side is the caller's to stop-gradient).
    """
    b, r, d = hidden_brd.shape
    c = max(1, min(chunk, r))
    n = -(-r // c)
    pad = n * c - r

    def split(h: Array) -> Array:
        return jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)

    @jax.checkpoint
    def one(args: tuple[Array, Array]) -> Array:
        h, ref_h = args
        return full_kl_from_logits(tfm.logits_from_hidden(params, h, model) / temperature,
                                   tfm.logits_from_hidden(ref_params, ref_h, model) / temperature)

    kl_nbc = jax.lax.map(one, (split(hidden_brd), split(ref_hidden_brd)))
    return kl_nbc.swapaxes(0, 1).reshape(b, n * c)[:, :r]


@dataclasses.dataclass(frozen=True)
class TransformerPolicy:
    """A `ModelConfig`'s transformer behind the policy protocol."""

    model: ModelConfig

    @property
    def remat(self) -> str:
        return self.model.remat

    def teacher_forced(
        self, params: Any, tokens_bs: Array, mask_bs: Array, positions_bs: Array, response_len: int, *,
        ref_params: Any = None, entropy: bool = False, full_kl: bool = False, chunk: int = 256,
        layers_grad_acc: Any = None, ref_logp: bool = False, temperature: float = 1.0,
    ) -> dict[str, Array]:
        r = response_len
        hidden = response_hidden(params, tokens_bs, mask_bs, positions_bs, r, self.model, layers_grad_acc)
        out = tfm.logprobs_from_hidden(params, hidden, tokens_bs[:, -r:], self.model, chunk_size=chunk,
                                       temperature=temperature, with_entropy=entropy)
        result = dict(zip(("logp", "entropy"), out, strict=True)) if entropy else {"logp": out}
        if full_kl or ref_logp:
            if ref_params is None:
                raise ValueError("the full-vocabulary KL and the reference log-probs need ref_params")
            ref_hidden = response_hidden(ref_params, tokens_bs, mask_bs, positions_bs, r, self.model)
            if ref_logp:
                result["ref_logp"] = tfm.logprobs_from_hidden(ref_params, ref_hidden, tokens_bs[:, -r:], self.model,
                                                              chunk_size=chunk, temperature=temperature)
            if full_kl:
                result["full_kl"] = full_kl_from_hidden(params, ref_params, hidden, ref_hidden, self.model, chunk,
                                                        temperature)
        return result

    def sample(self, params: Any, prompt_tokens_bp: Any, prompt_mask_bp: Any, key: Array, sampling: Any,
               mesh: Any = None) -> Any:
        return sampling_lib.generate(params, self.model, prompt_tokens_bp, prompt_mask_bp, key, sampling, mesh=mesh)
