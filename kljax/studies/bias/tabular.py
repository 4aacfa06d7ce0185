"""Tabular autoregressive policies over every prefix, small enough to enumerate exactly.

A policy over responses y = (y_1..y_T) in a vocabulary of size V has one logit row per prefix:
prefixes of length t are numbered offset_t + (base-V value of y_<t), offset_t = (V^t - 1)/(V - 1),
so `logits_pv` has shape [P, V] with P = (V^T - 1)/(V - 1) rows (all prefixes of length 0..T-1).
All V^T sequences are enumerated in lexicographic order by `all_sequences`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from kljax.policies.tabular import prefix_rows

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TabularSpace:
    """Vocabulary size V and response length T of a tabular policy."""

    vocab: int
    length: int

    def __post_init__(self) -> None:
        if self.vocab < 2:
            raise ValueError(f"vocab={self.vocab} must be >= 2")
        if self.length < 1:
            raise ValueError(f"length={self.length} must be >= 1")

    @property
    def num_prefixes(self) -> int:
        return sum(self.vocab**t for t in range(self.length))

    @property
    def num_sequences(self) -> int:
        return self.vocab**self.length


def all_sequences(space: TabularSpace) -> np.ndarray:
    """Every response, [V^T, T] int32, lexicographic (first token most significant)."""
    v, t = space.vocab, space.length
    index = np.arange(v**t)
    digits = [(index // v ** (t - 1 - i)) % v for i in range(t)]
    return np.stack(digits, axis=1).astype(np.int32)


def prefix_ids(space: TabularSpace, seqs_nt: np.ndarray) -> np.ndarray:
    """Row of `logits_pv` used at each position: [N, T] int32 (`models.tabular.prefix_rows`)."""
    return np.asarray(prefix_rows(space.vocab, jnp.asarray(seqs_nt)))


def init_logits(key: Array, space: TabularSpace, scale: float = 1.0, dtype=jnp.float32) -> Array:
    """Random logits [P, V] ~ scale * N(0, 1)."""
    return scale * jax.random.normal(key, (space.num_prefixes, space.vocab), dtype)


def token_logps(logits_pv: Array, seqs_nt: Array, ids_nt: Array) -> Array:
    """log pi(y_t | y_<t) for each sequence and position: [N, T]."""
    logp_ntv = jax.nn.log_softmax(logits_pv[ids_nt], axis=-1)
    return jnp.take_along_axis(logp_ntv, seqs_nt[..., None], axis=-1)[..., 0]


def step_logits(logits_pv: Array, ids_nt: Array) -> Array:
    """The full next-token logits at each position: [N, T, V] (for the full-vocabulary KL)."""
    return logits_pv[ids_nt]
