"""LoRA adapters on the transformer's projections, as pure functions over the params pytree.

For a target projection y = x . W (W [in..., out...], contracted over x's last n_in axes):
    y = x . W + s * (x . A) . B,     A [in..., r],  B [r, out...],  s = alpha / r
with A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) and B = 0 at initialisation (PEFT's defaults), so the adapted
model equals the base until the first update. Targets: any of `TARGETS` (q, k, v, o, gate, up, down); A, B
are stacked on the `layers` axis and live in params["layers"] as `{target}_lora_a` / `{target}_lora_b`:
    params = combine(base, init_adapters(config, key))   # `base` alone is the reference
    merged = merge(params, config)                       # W + s A.B, adapters removed
The forward applies an adapter exactly where the tree carries one, so one copy of the base serves policy
and reference; only the adapters are trained (`kljax.train.step` combines them with the frozen base).
Sharding (`logical_axes`): A has its base weight's input axes, B its output axes, the rank axis replicated
(on an fsdp-only mesh the B of q, k, v, gate, up and the A of o, down sit whole on each device). Adapters are
float32 whatever the base's dtype, cast to the compute dtype at use. Plain JAX rather than qwix or flax's
LoRA: those wrap flax modules, and this model is pure functions over a dict of stacked arrays.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from kljax.config.sections import LORA_TARGETS as TARGETS
from kljax.config.sections import LoraConfig
from kljax.errors import UserError
from kljax.models.config import ModelConfig
from kljax.models.layers import project as base_project

__all__ = ["TARGETS", "LoraConfig", "combine", "init_adapters", "merge", "project"]

Params = dict[str, Any]
ADAPTER_DTYPE = jnp.float32
# PEFT / HF module names of each target (for the PEFT adapter export).
HF_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
              "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def target_axes(config: ModelConfig, target: str) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...],
                                                          tuple[str, ...]]:
    """(input shape, input logical axes, output shape, output logical axes) of a target's base weight
    (its per-layer shape is input + output; `transformer._param_table`)."""
    d, f = config.hidden_size, config.intermediate_size
    h, kv, dh = config.num_heads, config.num_kv_heads, config.head_dim
    table = {
        "q": ((d,), ("embed",), (h, dh), ("heads", "head_dim")),
        "k": ((d,), ("embed",), (kv, dh), ("kv_heads", "head_dim")),
        "v": ((d,), ("embed",), (kv, dh), ("kv_heads", "head_dim")),
        "o": ((h, dh), ("heads", "head_dim"), (d,), ("embed",)),
        "gate": ((d,), ("embed",), (f,), ("mlp",)),
        "up": ((d,), ("embed",), (f,), ("mlp",)),
        "down": ((f,), ("mlp",), (d,), ("embed",)),
    }
    return table[target]


def _table(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """adapter name -> ([L, ...] shape, logical axes) for config.lora."""
    lora = _require(config)
    n, r = config.num_layers, lora.rank
    out = {}
    for t in lora.targets:
        in_shape, in_axes, out_shape, out_axes = target_axes(config, t)
        out[f"{t}_lora_a"] = ((n, *in_shape, r), ("layers", *in_axes, None))
        out[f"{t}_lora_b"] = ((n, r, *out_shape), ("layers", None, *out_axes))
    return out


def check_rank(config: ModelConfig) -> None:
    """A UserError when model.lora.rank exceeds a target's input or output width: a rank above
    min(in, out) adds parameters and no expressiveness (and a huge one exhausts memory)."""
    if config.lora is None:
        return
    for t in config.lora.targets:
        in_shape, _, out_shape, _ = target_axes(config, t)
        limit = min(math.prod(in_shape), math.prod(out_shape))
        if config.lora.rank > limit:
            raise UserError(f"model.lora.rank={config.lora.rank} exceeds the {t} projection's width: its input and "
                            f"output have {math.prod(in_shape)} and {math.prod(out_shape)} features; choose a rank "
                            f"<= {limit}")


def _require(config: ModelConfig) -> LoraConfig:
    if config.lora is None:
        raise ValueError("this model has no LoRA adapters (model.lora.rank is 0)")
    return config.lora


def init_adapters(config: ModelConfig, key: jax.Array) -> Params:
    """{"layers": {"q_lora_a": [L, D, r], "q_lora_b": [L, r, H, Dh], ...}}: A uniform in +-1/sqrt(fan_in),
    B zero (float32)."""
    table = _table(config)
    keys = jax.random.split(key, len(table))
    layers = {}
    for k, (name, (shape, _)) in zip(keys, table.items(), strict=True):
        if name.endswith("_lora_a"):
            bound = 1.0 / math.sqrt(math.prod(shape[1:-1]))
            layers[name] = jax.random.uniform(k, shape, ADAPTER_DTYPE, -bound, bound)
        else:
            layers[name] = jnp.zeros(shape, ADAPTER_DTYPE)
    return {"layers": layers}


def adapter_shapes(config: ModelConfig) -> Params:
    """`jax.ShapeDtypeStruct` tree of `init_adapters`, without allocating."""
    return {"layers": {name: jax.ShapeDtypeStruct(shape, ADAPTER_DTYPE) for name, (shape, _) in _table(config).items()}}


def logical_axes(config: ModelConfig) -> Params:
    """PartitionSpecs of logical axis names for the adapter tree (module docstring: sharding)."""
    return {"layers": {name: PartitionSpec(*axes) for name, (_, axes) in _table(config).items()}}


def count(config: ModelConfig) -> int:
    """Number of adapter scalars."""
    return sum(math.prod(shape) for shape, _ in _table(config).values())


def combine(base: Params, adapters: Params) -> Params:
    """The adapted policy's params: the base tree with the adapters beside their weights (no copy)."""
    return {**base, "layers": {**base["layers"], **adapters["layers"]}}


def is_adapter(name: str) -> bool:
    return name.endswith(("_lora_a", "_lora_b"))


def base_of(params: Params) -> Params:
    """The params without their adapters."""
    return {**params, "layers": {k: v for k, v in params["layers"].items() if not is_adapter(k)}}


def project(x: jax.Array, lp: Params, target: str, n_in: int, config: ModelConfig) -> jax.Array:
    """x . W (+ s (x . A) . B where lp carries the target's adapter), in x.dtype; the matmuls are
    `layers.project` (plain or cpu kernels), so both kernel settings and every remat policy apply."""
    dt = x.dtype
    y = base_project(x, lp[target].astype(dt), n_in, config)
    a = lp.get(f"{target}_lora_a")
    if a is None:
        return y
    xa = base_project(x, a.astype(dt), n_in, config)
    delta = base_project(xa, lp[f"{target}_lora_b"].astype(dt), 1, config)
    return (y.astype(jnp.float32) + _require(config).scale * delta.astype(jnp.float32)).astype(dt)


def delta(params: Params, target: str, config: ModelConfig) -> jax.Array:
    """s * A . B stacked over layers, float32, in the base weight's shape [L, in..., out...]."""
    layers = params["layers"]
    a, b = layers[f"{target}_lora_a"].astype(jnp.float32), layers[f"{target}_lora_b"].astype(jnp.float32)
    n, r = a.shape[0], a.shape[-1]
    ab = jnp.einsum("lir,lro->lio", a.reshape(n, -1, r), b.reshape(n, r, -1))
    return _require(config).scale * ab.reshape(a.shape[:-1] + b.shape[2:])


def merge(params: Params, config: ModelConfig) -> Params:
    """The adapted params as a plain model: W + s A . B in each target (summed in float32, stored
    in W's dtype), adapters removed. Equal in function to the unmerged params up to rounding."""
    out = base_of(params)
    layers = dict(out["layers"])
    for t in (t for t in TARGETS if f"{t}_lora_a" in params["layers"]):
        w = layers[t]
        layers[t] = (w.astype(jnp.float32) + delta(params, t, config)).astype(w.dtype)
    return {**out, "layers": layers}
