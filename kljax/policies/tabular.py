"""A tabular autoregressive policy behind the policy protocol: one logit row per (prompt, prefix).

Responses are y = (y_1..y_R) over V tokens (one of them may be a stop token). The prompt is one
token, its id p in [0, num_prompts), last in the left-padded prompt. Prefix y_<t has the row
    offset_t + (base-V value of y_<t),   offset_t = sum_{i<t} V^i,
so `params["logits"]` has shape [num_prompts, Q, V] with Q = sum_{t<R} V^t (every prefix of length
0..R-1; those after a stop token are never used). Small spaces are enumerable exactly, which is
what lets tests and studies compute E[gradient] of the real rollout and train step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models.transformer import positions_from_mask
from kljax.rl.estimators import full_kl_from_logits
from kljax.sampling import SampleResult
from kljax.sampling.logits import sample_logits

Array = jax.Array


def prefix_rows(vocab: int, seqs_nt: Array) -> Array:
    """Row of the prefix before each position, [N, T] int32: offset_t + base-V value of y_<t,
    offset_t = sum_{i<t} V^i. The one prefix numbering of every tabular policy in kljax."""
    rows, value, offset = [], jnp.zeros(seqs_nt.shape[:1], jnp.int32), 0
    for t in range(seqs_nt.shape[1]):
        rows.append(offset + value)
        offset += vocab**t
        value = value * vocab + jnp.asarray(seqs_nt)[:, t].astype(jnp.int32)
    return jnp.stack(rows, axis=1)


@dataclasses.dataclass(frozen=True)
class TabularPolicy:
    """vocab V, response_len R (the response buffer), num_prompts; the sampler's stop tokens come
    from `SamplingParams.stop_token_ids` as for the transformer."""

    vocab: int
    response_len: int
    num_prompts: int = 1
    remat: str = "none"  # no layers: nothing to recompute

    def __post_init__(self) -> None:
        for name, low in (("vocab", 2), ("response_len", 1), ("num_prompts", 1)):
            if int(getattr(self, name)) < low:
                raise ValueError(f"TabularPolicy {name}={getattr(self, name)!r} must be >= {low}")

    @property
    def num_prefixes(self) -> int:
        return sum(self.vocab**t for t in range(self.response_len))

    def init_params(self, key: Array, scale: float = 1.0, dtype: Any = jnp.float32) -> dict[str, Array]:
        """Random logits ~ scale * N(0, 1), {"logits": [num_prompts, Q, V]}."""
        shape = (self.num_prompts, self.num_prefixes, self.vocab)
        return {"logits": scale * jax.random.normal(key, shape, dtype)}

    def response_logits(self, params: Any, prompt_b: Array, response_br: Array) -> Array:
        """Next-token logits at each response position, [B, R, V]."""
        rows_br = prefix_rows(self.vocab, jnp.clip(response_br, 0, self.vocab - 1))
        return params["logits"][jnp.clip(prompt_b, 0, self.num_prompts - 1)[:, None], rows_br]

    def teacher_forced(
        self, params: Any, tokens_bs: Array, mask_bs: Array, positions_bs: Array, response_len: int, *,
        ref_params: Any = None, entropy: bool = False, full_kl: bool = False, chunk: int = 256,
        layers_grad_acc: Any = None, ref_logp: bool = False, temperature: float = 1.0,
    ) -> dict[str, Array]:
        r = response_len
        prompt_b = tokens_bs[:, -r - 1]
        response_br = tokens_bs[:, -r:]
        targets = jnp.clip(response_br, 0, self.vocab - 1)[..., None]

        def logp_of(p: Any) -> tuple[Array, Array]:
            logits = self.response_logits(p, prompt_b, response_br) / temperature
            logp_brv = jax.nn.log_softmax(logits, axis=-1)
            return logits, jnp.take_along_axis(logp_brv, targets, axis=-1)[..., 0]

        logits, logp = logp_of(params)
        out = {"logp": logp}
        if entropy:
            logp_brv = jax.nn.log_softmax(logits, axis=-1)
            out["entropy"] = -jnp.sum(jnp.exp(logp_brv) * logp_brv, axis=-1)
        if full_kl or ref_logp:
            if ref_params is None:
                raise ValueError("the full-vocabulary KL and the reference log-probs need ref_params")
            ref_logits, out_ref = logp_of(ref_params)
            if ref_logp:
                out["ref_logp"] = out_ref
            if full_kl:
                out["full_kl"] = full_kl_from_logits(logits, ref_logits)
        return out

    def sample(self, params: Any, prompt_tokens_bp: Any, prompt_mask_bp: Any, key: Array, sampling: Any,
               mesh: Any = None) -> Any:
        """`sampling.n` responses per prompt, drawn token by token with the transformer sampler's
        own draw (`kljax.sampling.logits.sample_logits`), in a `SampleResult`."""
        if sampling.max_new_tokens != self.response_len:
            raise ValueError(
                f"max_new_tokens={sampling.max_new_tokens} must equal the tabular policy's response_len="
                f"{self.response_len}"
            )
        prompts_bp = np.asarray(prompt_tokens_bp)
        mask_bp = np.ones(prompts_bp.shape, bool) if prompt_mask_bp is None else np.asarray(prompt_mask_bp, bool)
        tokens_rp = jnp.asarray(np.repeat(prompts_bp, sampling.n, axis=0), jnp.int32)
        mask_rp = jnp.asarray(np.repeat(mask_bp, sampling.n, axis=0))
        return _sample(self, params, tokens_rp, mask_rp, key, sampling)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _sample(policy: TabularPolicy, params: Any, tokens_rp: Array, mask_rp: Array, key: Array, sampling: Any) -> Any:
    rows, r = tokens_rp.shape[0], policy.response_len
    prompt_r = tokens_rp[:, -1]
    stops = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)
    response = jnp.zeros((rows, r), jnp.int32)
    logps, ents, alive = [], [], jnp.ones((rows,), bool)
    alive_before = []
    for t in range(r):
        logits_rv = policy.response_logits(params, prompt_r, response)[:, t]
        token, logp, ent = sample_logits(logits_rv, jax.random.fold_in(key, t), sampling)
        response = response.at[:, t].set(jnp.where(alive, token, 0))
        alive_before.append(alive)
        logps.append(logp)
        ents.append(ent if ent is not None else jnp.zeros_like(logp))
        alive = alive & ~jnp.any(token[:, None] == stops[None], axis=1)
    mask_rn = jnp.stack(alive_before, axis=1)
    logp_rn = jnp.where(mask_rn, jnp.stack(logps, axis=1), 0.0)
    ent_rn = jnp.where(mask_rn, jnp.stack(ents, axis=1), 0.0) if sampling.entropy else None
    seq_tokens = jnp.concatenate([tokens_rp, response], axis=1)
    seq_mask = jnp.concatenate([mask_rp, mask_rn], axis=1)
    lengths = jnp.sum(mask_rn, axis=1).astype(jnp.int32)
    return SampleResult(
        response_tokens_rn=response, response_mask_rn=mask_rn, response_logprobs_rn=logp_rn,
        response_entropy_rn=ent_rn, response_lengths_r=lengths, stopped_r=~alive,
        prompt_tokens_rp=tokens_rp, prompt_mask_rp=mask_rp, sequence_tokens_rs=seq_tokens,
        sequence_mask_rs=seq_mask, sequence_positions_rs=positions_from_mask(seq_mask),
        num_steps=jnp.asarray(r, jnp.int32),
    )


def sequence_probabilities(policy: TabularPolicy, params: Any, prompt: int, responses_nr: np.ndarray,
                           mask_nr: np.ndarray) -> Array:
    """pi(y | prompt) of each response (product over its unmasked tokens), [N]."""
    prompt_n = jnp.full((responses_nr.shape[0],), prompt, jnp.int32)
    logits = policy.response_logits(params, prompt_n, jnp.asarray(responses_nr))
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), jnp.asarray(responses_nr)[..., None], -1)[..., 0]
    return jnp.exp(jnp.sum(jnp.where(jnp.asarray(mask_nr), logp, 0.0), axis=1))


def all_responses(vocab: int, response_len: int, stop_token: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Every distinct response (tokens [N, R], mask [N, R]): sequences that end at their first stop
    token (padded with 0 after it) or run the whole buffer. Their probabilities sum to 1."""
    out: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...]) -> None:
        if len(prefix) == response_len or (prefix and prefix[-1] == stop_token):
            out.append(prefix)
            return
        for v in range(vocab):
            grow(prefix + (v,))

    grow(())
    tokens = np.zeros((len(out), response_len), np.int32)
    mask = np.zeros((len(out), response_len), bool)
    for i, seq in enumerate(out):
        tokens[i, : len(seq)] = seq
        mask[i, : len(seq)] = True
    return tokens, mask
