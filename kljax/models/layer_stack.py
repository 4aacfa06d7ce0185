"""The decoder layers for a micro-batched update: a backward pass that adds the layers' weight
gradients into an accumulator in place.

Accumulating micro-batch gradients as `acc + grad(loss_k)` holds two gradient trees at once: the
accumulator, and the micro-batch's gradient, which the backward of `lax.scan` over the layers writes
into fresh stacked [L, ...] buffers before the sum (docs/performance.md has XLA's temporaries). PyTorch
adds into `.grad` in place; this is the same for the stacked layers:

    accumulate_layers(layers, acc, x, rope, allowed, config) = the layer scan of
        `transformer.forward_hidden` (no cache) applied to x                 (forward)
    the cotangent it returns for `layers` is acc + d(loss)/d(layers)          (backward)

so `jax.grad` of a loss built on it gives the layers' entry of the accumulated sum directly. The backward
is a reverse `lax.scan` that carries `acc` and writes layer i's sum back in place, recomputing each layer
from its saved input (as remat='full'), so one layer's activations exist at a time. `acc` gets no cotangent.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from kljax.models.config import ModelConfig
from kljax.models.decoder_layer import decoder_layer
from kljax.parallel.sharding import constrain_batch

Params = Any


def _layer_fn(config: ModelConfig, allowed_bts: jax.Array):
    def fn(lp: Params, x_btd: jax.Array, rope: tuple[jax.Array, jax.Array], i: jax.Array) -> jax.Array:
        return constrain_batch(decoder_layer(x_btd, lp, rope, allowed_bts, None, i, None, config)[0])

    return fn


def _forward(layers: Params, x_btd: jax.Array, rope: Any, allowed_bts: jax.Array,
             config: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """(output [B, T, D], every layer's input stacked [L, B, T, D])."""
    fn = _layer_fn(config, allowed_bts)

    def body(x, layer):
        lp, i = layer
        return fn(lp, x, rope, i), x

    return jax.lax.scan(body, x_btd, (layers, jnp.arange(config.num_layers)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def accumulate_layers(layers: Params, acc: Params, x_btd: jax.Array, rope: Any, allowed_bts: jax.Array,
                      config: ModelConfig) -> jax.Array:
    """The decoder layers applied to x [B, T, D]; see the module docstring for the backward."""
    return _forward(layers, x_btd, rope, allowed_bts, config)[0]


def _fwd(layers, acc, x_btd, rope, allowed_bts, config):
    out, inputs_lbtd = _forward(layers, x_btd, rope, allowed_bts, config)
    return out, (layers, acc, inputs_lbtd, rope, allowed_bts)


def _bwd(config, res, ct_out):
    layers, acc, inputs_lbtd, rope, allowed_bts = res
    fn = _layer_fn(config, allowed_bts)
    at = lambda tree, i: jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), tree)

    def body(carry, i):
        ct_x, ct_rope, acc = carry
        _, vjp = jax.vjp(lambda lp, x, r: fn(lp, x, r, i), at(layers, i), inputs_lbtd[i], rope)
        ct_lp, ct_x, ct_r = vjp(ct_x)
        acc = jax.tree.map(lambda a, g: jax.lax.dynamic_update_index_in_dim(
            a, jax.lax.dynamic_index_in_dim(a, i, keepdims=False) + g.astype(a.dtype), i, 0), acc, ct_lp)
        return (ct_x, jax.tree.map(jnp.add, ct_rope, ct_r), acc), None

    zeros_rope = jax.tree.map(jnp.zeros_like, rope)
    (ct_x, ct_rope, acc), _ = jax.lax.scan(body, (ct_out, zeros_rope, acc), jnp.arange(config.num_layers),
                                           reverse=True)
    return acc, None, ct_x, ct_rope, None


accumulate_layers.defvjp(_fwd, _bwd)
