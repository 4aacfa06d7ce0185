"""The sampler's prompt chunks (`SamplingParams.chunk`): how many, and the strided split of a batch
into them and back. Pure shape functions; `kljax.sampling.sampler` runs the chunks one after another.

Chunk c of C holds prompts c, c + C, c + 2C, ... (as the train step's micro-batches): rows are
sharded over devices in contiguous blocks, so every chunk spans every device's rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from kljax.sampling.step import constrain_batch


def num_chunks(prompts: int, chunk: int) -> int:
    """How many sampler chunks a batch of `prompts` prompts runs in (`SamplingParams.chunk`)."""
    if chunk <= 0 or chunk >= prompts:
        return 1
    if prompts % chunk:
        raise ValueError(f"sampler chunk of {chunk} prompts does not divide the batch of {prompts} prompts")
    return prompts // chunk


def split_prompts(x_b: jax.Array, chunks: int, mesh: Mesh | None) -> jax.Array:
    """[B, ...] -> [C, B/C, ...]: chunk c holds rows c, c + C, ..."""
    b = x_b.shape[0]
    return constrain_batch(x_b.reshape(b // chunks, chunks, *x_b.shape[1:]).swapaxes(0, 1), mesh, axis=1)


def join_rows(x_cr: jax.Array, chunks: int, prompts: int, mesh: Mesh | None) -> jax.Array:
    """A chunked output back in batch order: [C, B/C * n, ...] -> [B * n, ...] (row (k C + c) n + i is
    sample i of prompt k C + c); a per-chunk scalar [C] (the decode steps run) -> its maximum."""
    if x_cr.ndim == 1:
        return jnp.max(x_cr)
    x = x_cr.reshape(chunks, prompts // chunks, -1, *x_cr.shape[2:]).swapaxes(0, 1)
    return constrain_batch(x.reshape(-1, *x_cr.shape[2:]), mesh)
