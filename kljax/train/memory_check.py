"""Sizes refused before they are allocated: a lower bound on the memory a run or an evaluation needs,
compared with what the machine can give, so a config that cannot fit fails in one line with both
numbers instead of being killed by the OOM killer minutes later.

The estimates are lower bounds (what must exist at once, not XLA's temporaries), so a refusal is certain
and a pass is not a promise: `train_estimate` (weights, the reference, optimizer state, the sampler's KV
cache, the residual stream the backward keeps) and `eval_estimate` (examples and completions in host
memory). The limit is the memory the OS reports available (`host_available`: /proc/meminfo MemAvailable,
lowered to the cgroup's remaining limit) on a CPU backend, the devices' memory elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from kljax.errors import UserError
from kljax.models.config import num_params

GIB = 2**30
STRING_BYTES = 57  # a Python str object (49 bytes empty) and its list slot (8)
EXAMPLE_BYTES = 56 + 64 + 3 * 49  # an Example, its metadata dict, prompt/answer/rendered text objects


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Named parts (bytes) of a lower bound on the memory needed."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return " + ".join(f"{name} {_gib(n)}" for name, n in self.parts.items() if n)


def _gib(n: float) -> str:
    if n >= 2**40:
        return f"{n / 2**40:.3g} TiB"
    return f"{n / GIB:.3g} GiB" if n >= GIB / 100 else f"{n / 2**20:.3g} MiB"


def _itemsize(dtype: Any) -> int:
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def kv_cache_bytes(model: Any, rows: int, length: int) -> int:
    """The sampler's K and V caches: 2 * layers * rows * length * kv_heads * head_dim * compute bytes."""
    return 2 * model.num_layers * rows * length * model.num_kv_heads * model.head_dim * _itemsize(model.dtype)


def train_estimate(model: Any, rl: Any) -> Estimate:
    """Lower bound on a run's memory for a transformer `model` (ModelConfig) and `rl` (RLConfig), P parameters:
        weights      P * param bytes (the trained copy) + P * frozen bytes (the reference; with LoRA the base)
        optimizer    3 * P * param bytes (Adam's two moments and the gradient; none for LoRA's frozen base)
        KV cache     `kv_cache_bytes` for B = prompts_per_step * group_size rows of
                     T = max_prompt_len + max_new_tokens
        activations  (B / micro_batches) * T * hidden * L * compute bytes (the residual stream the backward
                     keeps per layer, even with full remat)"""

    n = num_params(model)
    param, frozen = _itemsize(model.param_dtype), _itemsize(model.jnp_frozen_dtype)
    lora = getattr(model, "lora", None) is not None
    length = rl.max_prompt_len + rl.max_new_tokens
    rows = rl.prompts_per_step * rl.group_size
    return Estimate({
        "weights": n * frozen if lora else n * (param + frozen),
        "optimizer": 0 if lora else 3 * n * param,
        "KV cache": kv_cache_bytes(model, rows, length),
        "activations": (rows // rl.micro_batches) * length * model.hidden_size * model.num_layers
        * _itemsize(model.dtype),
    })


def eval_estimate(examples: int, samples: int) -> Estimate:
    """Lower bound on an evaluation's host memory: `examples` prompts (over all splits), each with
    its greedy and `samples` sampled completions held until scored: per example at least
    EXAMPLE_BYTES + (1 + samples) * STRING_BYTES (Python objects)."""
    return Estimate({"examples and completions": examples * (EXAMPLE_BYTES + (1 + samples) * STRING_BYTES)})


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available() -> tuple[int, str] | None:
    """(bytes, where from) of host memory this process can still get: MemAvailable of /proc/meminfo,
    or the cgroup's limit minus its usage when lower; None where neither can be read."""
    found: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"))
    except (OSError, ValueError, IndexError):
        pass
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append((max(limit - used, 0), "the cgroup's memory.max less memory.current"))
    if not found and hasattr(os, "sysconf"):
        try:
            found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages"))
        except (ValueError, OSError):
            pass
    return min(found) if found else None


def device_capacity() -> tuple[int, str] | None:
    """(bytes, where from) of the local accelerators' memory together; None when they do not say."""
    import jax

    total = 0
    for device in jax.local_devices():
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            return None
        total += int(stats["bytes_limit"])
    return total, f"the memory of {jax.local_device_count()} {jax.default_backend()} device(s)"


def available() -> tuple[int, str] | None:
    """What the estimates are compared with: host memory on a CPU backend, device memory elsewhere."""
    import jax

    return host_available() if jax.default_backend() == "cpu" else device_capacity()


def check_fits(estimate: Estimate, what: str, advice: str, limit: tuple[int, str] | None = None) -> None:
    """UserError when the lower bound `estimate` exceeds the memory available (or `limit`)."""
    limit = limit if limit is not None else available()
    if limit is None or estimate.total <= limit[0]:
        return
    raise UserError(f"{what} needs at least {_gib(estimate.total)} ({estimate.describe()}) but {_gib(limit[0])} "
                    f"is available ({limit[1]}); {advice}")


def check_train_fits(model: Any, rl: Any, limit: tuple[int, str] | None = None) -> None:
    """`check_fits` of `train_estimate` (a transformer only: other policies are tables of known size)."""
    if not hasattr(model, "num_kv_heads"):
        return
    check_fits(train_estimate(model, rl), "this run",
               "make the model smaller (model.tiny sizes or model.source) or rl.prompts_per_step * "
               "rl.group_size and the lengths smaller", limit)


def check_eval_fits(examples: int, samples: int, limit: tuple[int, str] | None = None) -> None:
    """`check_fits` of `eval_estimate` against host memory (where the examples live on any backend)."""
    check_fits(eval_estimate(examples, samples), f"evaluating {examples} examples with {samples} samples each",
               "lower --n-examples (or eval_examples) or --n-samples", limit or host_available())
