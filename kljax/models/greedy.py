"""A plain greedy decoder over the KV-cache forward: prefill once, then one jitted step per token.

This is the stand-in until the jitted `lax.while_loop` sampler (`kljax.sampling`) exists; it uses
the same `apply_with_cache` contract, so swapping it out changes only the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models.config import ModelConfig
from kljax.models.transformer import Params, apply_with_cache, init_cache, positions_from_mask


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to tokens_bt int32 [B, T] and mask_bt bool [B, T]."""
    t = max(len(s) for s in sequences)
    tokens = np.full((len(sequences), t), pad_id, np.int32)
    mask = np.zeros((len(sequences), t), bool)
    for b, s in enumerate(sequences):
        if len(s):
            tokens[b, t - len(s):] = s
            mask[b, t - len(s):] = True
    return tokens, mask


@partial(jax.jit, static_argnames="config", donate_argnames="cache")
def _step(params, tokens_bt, mask_bt, positions_bt, cache, cache_index, config):
    logits, cache = apply_with_cache(
        params, tokens_bt, mask_bt, positions_bt, cache, cache_index, config=config
    )
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache


def greedy_generate(
    params: Params,
    config: ModelConfig,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
) -> list[list[int]]:
    """Greedy continuations of each prompt: up to `max_new_tokens` ids per row, ending at an EOS id
    (included) if one is produced. Rows are left-padded into one batch."""
    tokens, mask = left_pad(prompts, pad_id)
    b, p = tokens.shape
    cache = init_cache(config, b, p + max_new_tokens)
    positions = positions_from_mask(jnp.asarray(mask))
    next_tok, cache = _step(params, tokens, mask, positions, cache, 0, config)
    last_pos = positions[:, -1:]
    out = np.zeros((b, max_new_tokens), np.int32)
    done = np.zeros(b, bool)
    lengths = np.full(b, max_new_tokens)
    eos = np.asarray(list(eos_ids), np.int32)
    ones = jnp.ones((b, 1), bool)
    for i in range(max_new_tokens):
        tok = np.asarray(next_tok)
        out[:, i] = tok
        newly = ~done & np.isin(tok, eos)
        lengths[newly] = i + 1
        done |= newly
        if done.all() or i == max_new_tokens - 1:
            break
        last_pos = last_pos + 1
        next_tok, cache = _step(params, tok[:, None], ones, last_pos, cache, p + i, config)
    return [out[r, : lengths[r]].tolist() for r in range(b)]
