"""Device mesh (`data`, `fsdp`, `tensor`) and the one table mapping logical axes to mesh axes.

Model code names logical axes (`kljax.models.transformer.logical_axes`); this module turns them
into `NamedSharding`s. A dimension whose size is not divisible by its mesh axes' size is replicated
on that dimension instead (e.g. 2 KV heads on tensor=4): always valid, and it is the sharding the
table would give on a smaller mesh. A mesh axis is used at most once per array (first dim wins).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or axes, or None = replicated). The only place this mapping lives.
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "layers": None,
}


def resolve_mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
    """Fill the one -1 axis with the rest of `num_devices`; raise ValueError saying what would fit."""
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    free = [k for k, v in sizes.items() if v == -1]
    bad = [k for k, v in sizes.items() if v == 0 or v < -1]
    if bad or len(free) > 1:
        raise ValueError(f"mesh axis sizes must be positive, with at most one -1; got {sizes}")
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if free:
        if num_devices % fixed:
            fits = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
            raise ValueError(
                f"mesh {sizes} does not fit {num_devices} devices: the fixed axes multiply to {fixed}, "
                f"which does not divide {num_devices}; their product must be one of {fits}"
            )
        sizes[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(
            f"mesh {sizes} needs {fixed} devices but {num_devices} are available; "
            f"the product data*fsdp*tensor must equal {num_devices} (use -1 for one axis to take the rest)"
        )
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default all), with Auto (GSPMD) axis types."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def logical_to_mesh_spec(
    logical: PartitionSpec,
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, str | tuple[str, ...] | None] = LOGICAL_RULES,
) -> PartitionSpec:
    """Mesh PartitionSpec for one array of `shape` whose dims carry the `logical` axis names."""
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match an array of shape {tuple(shape)}")
    used: set[str] = set()
    out = []
    for name, dim in zip(logical, shape, strict=True):
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise ValueError(f"unknown logical axis {name!r}; valid: {sorted(rules)}")
        target = rules[name]
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if a in mesh.shape and a not in used)
        size = math.prod(mesh.shape[a] for a in axes)
        if not axes or size == 1 or dim % size:
            out.append(None)
            continue
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def logical_to_sharding(
    axes_tree: Any,
    shapes_tree: Any,
    mesh: Mesh,
    rules: Mapping[str, str | tuple[str, ...] | None] = LOGICAL_RULES,
) -> Any:
    """NamedSharding pytree from a logical-axes pytree (PartitionSpec leaves) and matching shapes.

    `shapes_tree` leaves are anything with `.shape` (arrays, `jax.ShapeDtypeStruct`).
    """
    return jax.tree.map(
        lambda axes, x: NamedSharding(mesh, logical_to_mesh_spec(axes, x.shape, mesh, rules)),
        axes_tree,
        shapes_tree,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def on_one_cpu_device() -> bool:
    """True when the computation being traced runs on CPU and not under a mesh of more than one
    device: where work may be split into blocks along the batch without cutting across shards."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.default_backend() == "cpu" and (mesh.empty or mesh.size == 1)


def constrain_batch(x: jax.Array) -> jax.Array:
    """Shard an activation's leading (batch) dim over the (data, fsdp) axes of the mesh in context.

    Under `jax.set_mesh(mesh)` this pins activations to data parallelism, so the compiler
    all-gathers FSDP-sharded weights rather than replicating the batch on every device (which it
    otherwise may choose, holding whole-batch activations per device). Outside a mesh context, or
    when the batch does not divide, it returns x unchanged.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or x.ndim == 0:
        return x
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    axes = tuple(a for a in LOGICAL_RULES["batch"] if sizes.get(a, 1) > 1)
    if not axes or x.shape[0] % math.prod(sizes[a] for a in axes):
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(axes, *([None] * (x.ndim - 1))))


def data_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding for a batch array [B, ...]: batch over (data, fsdp), other dims replicated."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on `mesh`."""
    return NamedSharding(mesh, PartitionSpec())


def describe(shardings: Any) -> dict[str, str]:
    """'path' -> 'PartitionSpec' strings, for logs and tests."""
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    return {jax.tree_util.keystr(p): str(s.spec) for p, s in flat}


def device_put_host(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Place a host array (the same on every process) onto `sharding`, copying only each shard."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
