"""Deviceless TPU slices for `kljax plan`: compile-only devices from libtpu, no TPU attached.

With the `tpu` extra (libtpu matching the installed jax), `jax.experimental.topologies` builds the
device list of a named slice ("v5e:8x8", "v5p:2x2x2") on any host; programs lowered with
shardings over those devices compile with the TPU compiler, and the compiled programs have
`memory_analysis()` and `cost_analysis()` as on a real slice (as MaxText's train_compile.py does).
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

from jax.experimental import topologies

from kljax.studies.chips import CHIPS, Chip


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None without the `tpu` extra."""
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def topology_name(chip: str, count: int) -> tuple[str, dict[str, Any]]:
    """(topology name, keyword arguments of `get_topology_desc`) of a slice of `count` chips.

    2D tori (v5e, v6e): 1, 2, 4 (2x2), 8 (2x4), 16 (4x4), ... 256 (16x16) chips. 3D (v4, v5p, one
    megacore device per chip): 1, 2, 4 (2x2x1), 8 (2x2x2), 16 (2x2x4), 32 (2x4x4), 64 (4x4x4), ...
    Raises ValueError for a count that is not a power of two.
    """
    dims_n = CHIPS[chip].tpu_dims
    if dims_n == 0:
        raise ValueError(f"--chip {chip} is not a TPU; the TPU compiler plans v4, v5e, v5p and v6e slices")
    if count < 1 or count & (count - 1):
        raise ValueError(f"a {chip} slice of {count} chips: the TPU compiler plans slices of 1, 2, 4, 8, ... chips")
    kwargs: dict[str, Any] = {"chip_config_name": "megacore"} if dims_n == 3 else {}
    if count < 4:  # smaller than one host's 2x2 chips: say the host bounds
        dims = (count, 1, 1)[:dims_n] if dims_n == 2 else (1, count, 1)
        kwargs["chips_per_host_bounds"] = (count, 1, 1) if dims_n == 2 else (1, count, 1)
    elif dims_n == 2:
        k = count.bit_length() - 1
        dims = (2 ** (k // 2), count // 2 ** (k // 2))
    else:
        dims_l = [2, 2, 1]
        for i in range(count.bit_length() - 3):  # 2x2x2, then double z, y, x in turn: 2x2x4, 2x4x4, 4x4x4
            dims_l[2 if i == 0 else 2 - (i - 1) % 3] *= 2
        dims = tuple(dims_l)
    return f"{chip}:{'x'.join(map(str, dims))}", kwargs


ACCELERATOR_TYPES = {"v4": "v4-{cores}", "v5e": "v5litepod-{chips}", "v5p": "v5p-{cores}", "v6e": "v6e-{chips}"}


def tpu_devices(chip: Chip, count: int) -> list[Any]:
    """`count` compile-only devices of a `chip.name` slice (needs libtpu). Off a TPU VM, libtpu
    looks for the VM's accelerator type and workers and logs errors when it finds none: they are
    set to this slice on one local host first, where the environment does not already name them."""
    name, kwargs = topology_name(chip.name, count)
    cores = count * CHIPS[chip.name].cores
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", ACCELERATOR_TYPES[chip.name].format(cores=cores, chips=count))
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    devices = list(topologies.get_topology_desc(topology_name=name, platform="tpu", **kwargs).devices)
    if len(devices) != count:
        raise ValueError(f"topology {name} gave {len(devices)} devices, expected {count}")
    return devices
