"""A tiny causal transformer policy over a toy vocabulary, in pure JAX (a few thousand parameters).

Input at position t is y_{t-1} (a BOS id, `vocab`, at t = 0) plus a learned position embedding;
`n_layers` pre-RMSNorm blocks of causal multi-head attention and a GELU MLP; a final RMSNorm and an
unembedding to `vocab` logits. The logits at position t are the next-token logits of pi(. | y_<t):
causal masking makes them independent of y_t..y_{T-1}, so teacher forcing the V^T sequences of a
space gives every prefix's distribution exactly, like the tabular policy.

Parameters are a plain dict pytree; `init` draws them with `logit_scale` setting the spread of the
output logits (std about `logit_scale` at initialization), so random policies are far from uniform.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Params = dict


def numpy_rng(key: Any) -> np.random.Generator:
    """A NumPy generator from a JAX PRNG key (uint32 array or typed key), an int seed, or a Generator.

    Toy policies are initialized on the host: NumPy draws in microseconds what a compiled threefry
    draw takes seconds to compile on CPU."""
    if isinstance(key, np.random.Generator):
        return key
    if isinstance(key, (int, np.integer)):
        return np.random.default_rng(int(key))
    if jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.random.default_rng([int(x) for x in np.asarray(key).ravel()])


def rms_norm(x: Array, scale: Array, eps: float = 1e-6) -> Array:
    """x / rms(x) * scale over the last axis."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@dataclasses.dataclass(frozen=True)
class TinyTransformer:
    """Sizes of the transformer; `apply(params, seqs_nt) -> logits_ntv` is the whole model."""

    vocab: int
    length: int
    d_model: int = 16
    n_heads: int = 2
    n_layers: int = 2
    mlp_mult: int = 2
    logit_scale: float = 1.5

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")

    def shapes(self) -> list[tuple[str, tuple[int, ...], float]]:
        """(path, shape, init std) of every weight; norms (std 0) start at 1."""
        d, h = self.d_model, self.mlp_mult * self.d_model
        out = [
            ("embed", (self.vocab + 1, d), 1.0),
            ("pos", (self.length, d), 1.0),
            ("final_norm", (d,), 0.0),
            ("unembed", (d, self.vocab), self.logit_scale / math.sqrt(d)),
        ]
        for i in range(self.n_layers):
            out += [
                (f"layers.{i}.attn_norm", (d,), 0.0),
                (f"layers.{i}.qkv", (d, 3 * d), 1.0 / math.sqrt(d)),
                (f"layers.{i}.out", (d, d), 1.0 / math.sqrt(d)),
                (f"layers.{i}.mlp_norm", (d,), 0.0),
                (f"layers.{i}.up", (d, h), 1.0 / math.sqrt(d)),
                (f"layers.{i}.down", (h, d), 1.0 / math.sqrt(h)),
            ]
        return out

    def init(self, key: Any, dtype=jnp.float32) -> Params:
        """Random parameters: embeddings N(0, 1), weights N(0, 1/fan_in), norms 1. `key`: a JAX key,
        an int seed or a NumPy Generator (drawn on the host, see `numpy_rng`)."""
        rng = numpy_rng(key)
        params: Params = {"layers": [{} for _ in range(self.n_layers)]}
        for path, shape, std in self.shapes():
            x = jnp.asarray(rng.standard_normal(shape) * std + (1.0 if std == 0.0 else 0.0), dtype)
            parts = path.split(".")
            if parts[0] == "layers":
                params["layers"][int(parts[1])][parts[2]] = x
            else:
                params[path] = x
        return params

    def _attention(self, layer: Params, x_ntd: Array) -> Array:
        n, t, d = x_ntd.shape
        hd = d // self.n_heads
        qkv = rms_norm(x_ntd, layer["attn_norm"]) @ layer["qkv"]  # [N, T, 3D]
        q, k, v = (a.reshape(n, t, self.n_heads, hd) for a in jnp.split(qkv, 3, axis=-1))
        scores_nhts = jnp.einsum("nthc,nshc->nhts", q, k) / math.sqrt(hd)
        causal_ts = jnp.tril(jnp.ones((t, t), bool))
        scores_nhts = jnp.where(causal_ts, scores_nhts, jnp.finfo(scores_nhts.dtype).min)
        attn_nhts = jax.nn.softmax(scores_nhts, axis=-1)
        out_nthc = jnp.einsum("nhts,nshc->nthc", attn_nhts, v)
        return out_nthc.reshape(n, t, d) @ layer["out"]

    def apply(self, params: Params, seqs_nt: Array) -> Array:
        """Next-token logits [N, T, V]: position t sees the BOS id and y_<t only."""
        n, t = seqs_nt.shape
        bos = jnp.full((n, 1), self.vocab, seqs_nt.dtype)
        inputs_nt = jnp.concatenate([bos, seqs_nt[:, :-1]], axis=1)
        x_ntd = params["embed"][inputs_nt] + params["pos"][None, :t]
        for layer in params["layers"]:
            x_ntd = x_ntd + self._attention(layer, x_ntd)
            hidden = jax.nn.gelu(rms_norm(x_ntd, layer["mlp_norm"]) @ layer["up"])
            x_ntd = x_ntd + hidden @ layer["down"]
        return rms_norm(x_ntd, params["final_norm"]) @ params["unembed"]

    def num_params(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.shapes())
