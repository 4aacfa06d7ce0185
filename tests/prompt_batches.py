"""Random left-padded prompt batches for the sampler tests."""

from __future__ import annotations

import numpy as np


def left_padded_prompts(b: int, vocab: int, low: int, seed: int = 0, width: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [B, width], mask bool [B, width]): prompts of 1..width ids in [low, vocab), left-padded with 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, width + 1, b)
    tokens = np.zeros((b, width), np.int32)
    mask = np.zeros((b, width), bool)
    for i, n in enumerate(lengths):
        tokens[i, width - n:] = rng.integers(low, vocab, n)
        mask[i, width - n:] = True
    return tokens, mask
