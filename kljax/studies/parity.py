"""Logit parity of a converted model against `transformers` (float32), for `kljax convert --check`.

Needs torch and transformers; import this module only where they are wanted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from kljax.models.convert import load_hf_checkpoint
from kljax.models.transformer import apply, positions_from_mask
from kljax.sampling import left_pad

DEFAULT_PROMPTS = (
    "What is 7 times 8?",
    "Write one sentence about the sea.",
    "List three prime numbers.",
)


def has_tokenizer(model_dir: str | os.PathLike) -> bool:
    return any((Path(model_dir) / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json"))


def prompt_token_ids(
    model_dir: str | os.PathLike,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    *,
    chat: bool = True,
    vocab_size: int | None = None,
    seed: int = 0,
) -> list[list[int]]:
    """Token ids of `prompts` (chat-templated when the tokenizer has a template). A directory with no
    tokenizer (a tiny random model) gets random ids of a few lengths below `vocab_size` instead."""
    if not has_tokenizer(model_dir):
        if vocab_size is None:
            raise ValueError(f"{model_dir} has no tokenizer; pass vocab_size for random prompts")
        rng = np.random.default_rng(seed)
        return [rng.integers(0, vocab_size, 5 + 3 * i).tolist() for i in range(len(prompts))]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if chat and tokenizer.chat_template:
        return [
            list(tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
            ))
            for p in prompts
        ]
    return [tokenizer.encode(p) for p in prompts]


def transformers_logits(model, tokens_bt: np.ndarray, mask_bt: np.ndarray) -> np.ndarray:
    """Float32 logits [B, T, V] of a transformers model on a left-padded batch."""
    import torch

    positions = np.asarray(positions_from_mask(mask_bt))
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(tokens_bt.astype(np.int64)),
            attention_mask=torch.from_numpy(mask_bt.astype(np.int64)),
            position_ids=torch.from_numpy(positions.astype(np.int64)),
        )
    return out.logits.float().numpy()


def compare_with_transformers(
    model_dir: str | os.PathLike,
    token_lists: Sequence[Sequence[int]] | None = None,
    *,
    scan_layers: bool = True,
) -> tuple[float, list[float]]:
    """(max abs logit difference over all valid positions, the same per prompt) in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    params, config = load_hf_checkpoint(model_dir, scan_layers=scan_layers)
    if token_lists is None:
        token_lists = prompt_token_ids(model_dir, vocab_size=config.vocab_size)
    tokens, mask = left_pad(token_lists, pad_id=config.pad_token_id or 0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = transformers_logits(model, tokens, mask)
    ours = np.asarray(jax.jit(apply, static_argnames="config")(params, tokens, mask, config=config))
    diff = np.abs(ours - ref).max(axis=-1)  # [B, T]
    per_row = [float(diff[b][mask[b]].max()) for b in range(len(token_lists))]
    return max(per_row), per_row
