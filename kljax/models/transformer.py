"""One decoder-only transformer (Llama, Qwen2/2.5, Qwen3) as pure functions over a params pytree.

Parameters are a nested dict of arrays; layer parameters are stacked on a leading `layers` axis (one layout
for conversion, sharding and checkpoints; `config.scan_layers` only picks `lax.scan` or a Python loop):
    embed [V, D], lm_head [D, V] (untied embeddings only), final_norm [D], layers/attn_norm, mlp_norm [L, D]
    layers/q [L, D, H, Dh], k, v [L, D, Kv, Dh], o [L, H, Dh, D], gate, up [L, D, F], down [L, F, D]
    layers/q_bias [L, H, Dh], k_bias, v_bias [L, Kv, Dh] (Qwen2), o_bias [L, D] (attention_bias=True,
    Llama/Qwen3), q_norm, k_norm [L, Dh] (Qwen3's per-head RMSNorm); logical axis names: `logical_axes`.
Inputs are `tokens_bt` int32 [B, T], `mask_bt` bool [B, T] (False = padding; left padding is the norm) and
`positions_bt` int32 [B, T] (RoPE positions, e.g. `positions_from_mask(mask_bt)`). Attention is causal over
the token index, and a query attends only to keys whose mask is True. Rows of padding get finite garbage,
never NaN. Compute runs in `config.dtype`; RMSNorm statistics, softmax and logits in float32. The sampler's
KV cache: `apply_with_cache`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from kljax.models.config import ModelConfig
from kljax.models.decoder_layer import (  # noqa: F401 - the transformer's cache and RoPE, used as tfm.X
    KVCache,
    apply_rope,
    decoder_layer,
    init_cache,
    positions_from_mask,
    rope_inv_freq,
    rope_tables,
)
from kljax.models.layer_stack import accumulate_layers
from kljax.models.layers import rms_norm
from kljax.models.vocab_logprobs import vocab_logits, vocab_logprobs
from kljax.parallel.sharding import constrain_batch

Params = dict[str, Any]


# ---------------------------------------------------------------------------------------- params


def _param_table(config: ModelConfig) -> dict[tuple[str, ...], tuple[tuple[int, ...], tuple[str, ...], str]]:
    """path -> (shape, logical axes, init kind) for every parameter of this configuration."""
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, kv, dh, n = config.num_heads, config.num_kv_heads, config.head_dim, config.num_layers
    table: dict[tuple[str, ...], tuple[tuple[int, ...], tuple[str, ...], str]] = {
        ("embed",): ((v, d), ("vocab", "embed"), "normal"),
        ("final_norm",): ((d,), ("embed",), "ones"),
    }
    if not config.tie_embeddings:
        table[("lm_head",)] = ((d, v), ("embed", "vocab"), "normal")
    layer: dict[str, tuple[tuple[int, ...], tuple[str, ...], str]] = {
        "attn_norm": ((d,), ("embed",), "ones"),
        "q": ((d, h, dh), ("embed", "heads", "head_dim"), "normal"),
        "k": ((d, kv, dh), ("embed", "kv_heads", "head_dim"), "normal"),
        "v": ((d, kv, dh), ("embed", "kv_heads", "head_dim"), "normal"),
        "o": ((h, dh, d), ("heads", "head_dim", "embed"), "normal"),
        "mlp_norm": ((d,), ("embed",), "ones"),
        "gate": ((d, f), ("embed", "mlp"), "normal"),
        "up": ((d, f), ("embed", "mlp"), "normal"),
        "down": ((f, d), ("mlp", "embed"), "normal"),
    }
    if config.qkv_bias:
        layer["q_bias"] = ((h, dh), ("heads", "head_dim"), "zeros")
        layer["k_bias"] = ((kv, dh), ("kv_heads", "head_dim"), "zeros")
        layer["v_bias"] = ((kv, dh), ("kv_heads", "head_dim"), "zeros")
    if config.o_bias:
        layer["o_bias"] = ((d,), ("embed",), "zeros")
    if config.qk_norm:
        layer["q_norm"] = ((dh,), ("head_dim",), "ones")
        layer["k_norm"] = ((dh,), ("head_dim",), "ones")
    for name, (shape, axes, kind) in layer.items():
        table[("layers", name)] = ((n, *shape), ("layers", *axes), kind)
    return table


def _nest(flat: dict[tuple[str, ...], Any]) -> Params:
    out: Params = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def param_paths(config: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Every parameter path of this configuration and its shape."""
    return {path: shape for path, (shape, _, _) in _param_table(config).items()}


def init_params(config: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters in `config.param_dtype` (normal(std) matrices, unit norms, zero biases)."""
    table = _param_table(config)
    keys = jax.random.split(key, len(table))
    dtype = config.jnp_param_dtype
    flat = {}
    for k, (path, (shape, _, kind)) in zip(keys, table.items(), strict=True):
        if kind == "normal":
            flat[path] = (std * jax.random.normal(k, shape, jnp.float32)).astype(dtype)
        else:
            flat[path] = (jnp.ones if kind == "ones" else jnp.zeros)(shape, dtype)
    return _nest(flat)


def param_shapes(config: ModelConfig) -> Params:
    """`jax.ShapeDtypeStruct` pytree of the parameters, without allocating them."""
    return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def frozen_copy(params: Params, config: ModelConfig) -> Params:
    """A copy, in new buffers, of parameters that only forward passes will read (the frozen reference,
    the async sampler's snapshots), in `config.jnp_frozen_dtype`.

    Exact: every forward casts each parameter to the compute dtype before its first use (weights,
    biases, norm scales, the embedding rows it gathers), so forward(frozen_copy(p)) equals forward(p)
    bit for bit, and with a 16-bit compute dtype over float32 parameters the copy takes half the
    memory (for an 8B model, 16 GB less for the reference). Keeps each array's sharding.
    """
    return _frozen_copy(params, config.jnp_frozen_dtype)


@functools.partial(jax.jit, static_argnums=1)
def _frozen_copy(params: Params, dtype: jnp.dtype) -> Params:
    # One program, not an eager op per array; jnp.copy under jit is a copy (a fresh buffer), so no
    # leaf aliases the input even where its dtype is kept.
    return jax.tree.map(lambda a: a.astype(dtype) if a.dtype != dtype else jnp.copy(a), params)


def logical_axes(config: ModelConfig) -> Params:
    """Pytree matching the params whose leaves are `PartitionSpec`s of logical axis names."""
    return _nest({path: PartitionSpec(*axes) for path, (_, axes, _) in _param_table(config).items()})


def count_params(params: Params) -> int:
    """Number of scalars in a params (or ShapeDtypeStruct) pytree."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def _unstacked(layers: Params) -> list[Params]:
    """params["layers"] as one tree per layer, by `jnp.unstack`: its transpose stacks the layers' gradients
    in one pass (indexing a[i] transposes to L pads summed, which XLA CPU fuses into one loop reading all L
    per element: slower, docs/performance.md)."""
    leaves, treedef = jax.tree.flatten(layers)
    per_leaf = [jnp.unstack(a) for a in leaves]
    return [treedef.unflatten(list(ps)) for ps in zip(*per_leaf, strict=True)]


def _remat(fn: Callable, config: ModelConfig) -> Callable:
    policies = {
        "full": None,
        "dots_saveable": jax.checkpoint_policies.dots_saveable,
        "dots_no_batch_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    }
    if config.remat == "none":
        return fn
    return jax.checkpoint(fn, policy=policies[config.remat], prevent_cse=not config.scan_layers)


# ---------------------------------------------------------------------------------------- forward


def forward_hidden(
    params: Params,
    tokens_bt: jax.Array,
    mask_bt: jax.Array | None,
    positions_bt: jax.Array | None,
    config: ModelConfig,
    cache: KVCache | None = None,
    cache_index: jax.Array | int | None = None,
    layers_grad_acc: Params | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """Final-norm hidden states [B, T, D] in `config.dtype`, and the updated cache (or None).

    `mask_bt` None means no padding; `positions_bt` None means `positions_from_mask(mask_bt)` (only
    without a cache). Token ids must lie in [0, V). With `layers_grad_acc` (a tree like
    params["layers"]; no cache) the layers run as `layer_stack.accumulate_layers`: the gradient of
    params["layers"] comes out as layers_grad_acc + the true gradient, summed in place.
    """
    b, t = tokens_bt.shape
    if cache is not None and positions_bt is None:
        raise ValueError("with a cache, pass positions_bt: the new tokens' positions depend on the prefix")
    mask_bt = jnp.ones((b, t), bool) if mask_bt is None else mask_bt.astype(bool)
    positions_bt = positions_from_mask(mask_bt) if positions_bt is None else positions_bt
    x = constrain_batch(jnp.take(params["embed"], tokens_bt, axis=0).astype(config.jnp_dtype))
    rope = rope_tables(positions_bt, config)
    query_slot = jnp.arange(t)
    if cache is None:
        key_mask = mask_bt
        key_slot = jnp.arange(t)
        cache_kv = None
    else:
        cache_index = jnp.asarray(0 if cache_index is None else cache_index, jnp.int32)
        key_mask = jax.lax.dynamic_update_slice(cache.mask, mask_bt, (0, cache_index))
        key_slot = jnp.arange(cache.mask.shape[1])
        query_slot = query_slot + cache_index
        cache_kv = (cache.k, cache.v)
    allowed = (key_slot[None, None, :] <= query_slot[None, :, None]) & key_mask[:, None, :]

    def body(carry, layer):
        x, kv = carry
        lp, i = layer
        x, kv = decoder_layer(x, lp, rope, allowed, kv, i, cache_index, config)
        return (constrain_batch(x), kv), None

    body = _remat(body, config)
    layers = params["layers"]
    if layers_grad_acc is not None:
        if cache is not None:
            raise ValueError("forward_hidden: layers_grad_acc is for training, not with a cache")
        x = accumulate_layers(layers, layers_grad_acc, x, rope, allowed, config)
    elif config.scan_layers:
        (x, cache_kv), _ = jax.lax.scan(body, (x, cache_kv), (layers, jnp.arange(config.num_layers)))
    else:
        for i, lp in enumerate(_unstacked(layers)):
            (x, cache_kv), _ = body((x, cache_kv), (lp, i))
    x = rms_norm(x, params["final_norm"], config.rms_norm_eps, config)
    new_cache = None if cache is None else KVCache(cache_kv[0], cache_kv[1], key_mask)
    return x, new_cache


def head_weight(params: Params, config: ModelConfig) -> tuple[jax.Array, bool]:
    """(the unembedding in the compute dtype, vocab_major): the tied embedding [V, D] (True) or the
    untied lm_head [D, V] (False)."""
    tied = config.tie_embeddings
    return (params["embed"] if tied else params["lm_head"]).astype(config.jnp_dtype), tied


def logits_from_hidden(params: Params, hidden_btd: jax.Array, config: ModelConfig) -> jax.Array:
    """Project hidden states [..., D] to float32 logits [..., V] (tied or untied unembedding)."""
    return vocab_logits(hidden_btd.astype(config.jnp_dtype), *head_weight(params, config))


def apply(
    params: Params,
    tokens_bt: jax.Array,
    mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
    *,
    config: ModelConfig,
) -> jax.Array:
    """Float32 logits [B, T, V]. Pure; use inside `jax.jit` / `jax.value_and_grad`."""
    hidden, _ = forward_hidden(params, tokens_bt, mask_bt, positions_bt, config)
    return logits_from_hidden(params, hidden, config)


def apply_with_cache(
    params: Params,
    tokens_bt: jax.Array,
    mask_bt: jax.Array,
    positions_bt: jax.Array,
    cache: KVCache,
    cache_index: jax.Array | int,
    *,
    config: ModelConfig,
) -> tuple[jax.Array, KVCache]:
    """Prefill or decode step: float32 logits [B, T, V] and the cache with these T tokens written.

    `KVCache(k, v, mask)`: k, v [L, B, S, Kv, Dh] in `config.dtype` (keys stored after RoPE), mask bool [B, S]
    (which slots hold real tokens); `init_cache(config, B, S)` makes an empty one. T new tokens at write
    index `cache_index` (int32 scalar, shared by the batch) write their keys/values into slots
    [cache_index, cache_index + T) and their `mask_bt` into mask; query t (slot cache_index + t) attends to
    slots s <= cache_index + t with mask[b, s]. Slot index is not position: the caller passes `positions_bt`
    (a left-padded prompt of length P: prefill writes slots [0, P), decode step i slot P + i at position
    last_position + 1 + i) and keeps cache_index + T <= S (out-of-range writes clamp). Prefill and decode are
    this one function; jit it with the cache donated to update in place.
    """
    hidden, new_cache = forward_hidden(params, tokens_bt, mask_bt, positions_bt, config, cache, cache_index)
    return logits_from_hidden(params, hidden, config), new_cache


def logprobs_from_hidden(
    params: Params,
    hidden_btd: jax.Array,
    targets_bt: jax.Array,
    config: ModelConfig,
    *,
    chunk_size: int = 512,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Per-token log p(target) [B, T] float32 (and entropy [B, T]) in chunks of `chunk_size` tokens.

    Each chunk's [B, chunk, V] float32 logits are formed inside `lax.map` by
    `vocab_logprobs.vocab_logprobs`, whose backward recomputes them: neither the forward nor the
    backward pass ever holds the full [B, T, V] logits.
    """
    b, t, d = hidden_btd.shape
    c = max(1, min(chunk_size, t))
    n = -(-t // c)
    pad = n * c - t
    h = jnp.pad(hidden_btd, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, d).swapaxes(0, 1)
    tg = jnp.pad(targets_bt, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)
    w, vocab_major = head_weight(params, config)

    def chunk(args):
        h_bcd, t_bc = args
        h_bcd = constrain_batch(h_bcd).astype(config.jnp_dtype)
        logp, ent = vocab_logprobs(h_bcd.reshape(b * c, d), w, t_bc.reshape(b * c), vocab_major, float(temperature),
                                   with_entropy)
        return logp.reshape(b, c), ent.reshape(b, c)

    logp, entropy = jax.lax.map(chunk, (h, tg))
    logp = logp.swapaxes(0, 1).reshape(b, n * c)[:, :t]
    if not with_entropy:
        return logp
    return logp, entropy.swapaxes(0, 1).reshape(b, n * c)[:, :t]


def token_logprobs(
    params: Params,
    tokens_bt: jax.Array,
    mask_bt: jax.Array | None,
    positions_bt: jax.Array | None,
    targets_bt: jax.Array,
    *,
    config: ModelConfig,
    chunk_size: int = 512,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """log p(targets_bt[b, t] | tokens_bt[b, :t+1]) [B, T] float32, optionally with entropy [B, T].

    For next-token log-probs pass `targets_bt = tokens_bt` shifted left by one; positions whose
    target is not a real token should be masked by the caller. Chunked: see `logprobs_from_hidden`.
    """
    hidden, _ = forward_hidden(params, tokens_bt, mask_bt, positions_bt, config)
    return logprobs_from_hidden(
        params, hidden, targets_bt, config,
        chunk_size=chunk_size, temperature=temperature, with_entropy=with_entropy,
    )
