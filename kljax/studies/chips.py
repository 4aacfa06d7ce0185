"""Accelerators `kljax plan` knows: memory, peak bfloat16 FLOP/s and HBM bandwidth per JAX device.

One table, `CHIPS`; docs/scaling.md names the public sources of every number. A JAX device is one
chip (v4 and v5p chips have 2 TensorCores run as one "megacore" device; their slices are named by
cores, v5p-32 = 16 chips; v5e and v6e slices by chips, v5e-64 = 64 chips) or one GPU.
"""

from __future__ import annotations

import dataclasses
import re

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """hbm_gib: memory per device; bf16_tflops: dense peak bfloat16 matmul TFLOP/s per device;
    hbm_gbps: memory bandwidth GB/s (1e9 B/s) per device; cores: TensorCores per chip (slice names
    count them); tpu_dims: 2 or 3 for a TPU's torus topology (0: not a TPU)."""

    hbm_gib: float
    bf16_tflops: float
    hbm_gbps: float
    cores: int = 1
    tpu_dims: int = 0


CHIPS: dict[str, ChipSpec] = {
    "v4": ChipSpec(32, 275, 1200, cores=2, tpu_dims=3),
    "v5e": ChipSpec(16, 197, 819, tpu_dims=2),
    "v5p": ChipSpec(95, 459, 2765, cores=2, tpu_dims=3),
    "v6e": ChipSpec(32, 918, 1638, tpu_dims=2),
    "h100": ChipSpec(80, 989, 3350),
    "h200": ChipSpec(141, 989, 4800),
    "a100-40": ChipSpec(40, 312, 1555),
    "a100-80": ChipSpec(80, 312, 2039),
    "a100": ChipSpec(80, 312, 2039),
}


@dataclasses.dataclass(frozen=True)
class Chip:
    """A device kind and (when named, as in v5e-64 or 8xh100) how many JAX devices a slice has."""

    name: str
    hbm_bytes: int
    devices: int | None = None

    @property
    def spec(self) -> ChipSpec:
        return CHIPS[self.name]

    @property
    def is_tpu(self) -> bool:
        return self.spec.tpu_dims > 0

    @property
    def peak_flops(self) -> float:
        """Peak bfloat16 FLOP/s of one device."""
        return self.spec.bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.spec.hbm_gbps * 1e9


def parse_chip(text: str) -> Chip:
    """'v5e', 'v5e-64' (64 chips), 'v5p-32' (32 cores = 16 chips), '8xh100', 'a100-80', 'h200'."""
    t = text.strip().lower()
    count = None
    m = re.fullmatch(r"(\d+)x(.+)", t)
    if m:
        count, t = int(m.group(1)), m.group(2)
    if t not in CHIPS:
        m = re.fullmatch(r"(v\d+[a-z]?)-(\d+)", t)
        if m and m.group(1) in CHIPS:
            t, cores = m.group(1), int(m.group(2))
            count = max(1, cores // CHIPS[t].cores)
    if t not in CHIPS:
        raise ValueError(f"unknown chip {text!r}; known: {sorted(CHIPS)} (TPU slices as v5e-64, GPUs as 8xh100)")
    return Chip(t, int(CHIPS[t].hbm_gib * GiB), count)
