"""Roofline bounds of a run's step from its compiled programs' cost analysis: pure arithmetic.

A program that does F FLOPs and moves M bytes of HBM per device takes at least
max(F / peak FLOP/s, M / HBM bandwidth) on that device; a step (sample, score, update) at least the
sum of its programs'. The bound ignores communication, latency and imperfect overlap, so a real
step is slower. XLA's cost analysis counts the body of a loop once, so `kljax.studies.plan_cost`
measures the loops' bodies (a layer, a micro-batch, a decode step) and scales them here.

MFU ceiling: model FLOPs / (roofline step time x peak x devices), model FLOPs counted as usual
(2 per weight a token for a forward, 6 for forward + backward, 4 for a LoRA update whose frozen
base gets no weight gradient; `model_flops`), so recomputation and attention are not in them.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Cost:
    """FLOPs and HBM bytes accessed of one program (or many) on one device."""

    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.flops - other.flops, self.bytes - other.bytes)

    def scale(self, k: float) -> Cost:
        return Cost(self.flops * k, self.bytes * k)

    def seconds(self, peak_flops: float, hbm_bytes_per_s: float) -> float:
        """The roofline lower bound of its run time."""
        return max(self.flops / peak_flops, self.bytes / hbm_bytes_per_s)


def compiled_cost(compiled: Any) -> Cost:
    """Per-device FLOPs and bytes accessed from `Compiled.cost_analysis()` (loop bodies counted once)."""
    ca = compiled.cost_analysis()
    if isinstance(ca, list | tuple):
        ca = ca[0] if ca else {}
    ca = ca or {}
    return Cost(float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0)))


def extrapolate_layers(one: Cost, two: Cost, layers: int) -> Cost:
    """The cost of an L-layer program from its 1- and 2-layer versions (unrolled): every layer adds
    the same, so cost(L) = cost(1) + (L - 1) (cost(2) - cost(1))."""
    return one + (two - one).scale(layers - 1)


def model_flops(matmul_params: int, prompts: int, group: int, prompt_len: int, new_tokens: int,
                score_forwards: int, lora: bool) -> dict[str, float]:
    """Model FLOPs of one step's phases (all devices) at full length: sampling 2 N (B P + B G N_new), scoring
    2 N B G S per forward pass, the update 6 N B G S (4 with LoRA), S = P + N_new; N the weights a
    token multiplies (the head included, the embedding lookup not)."""
    rows, seq = prompts * group, prompt_len + new_tokens
    sample = 2 * matmul_params * (prompts * prompt_len + rows * new_tokens)
    score = 2 * matmul_params * rows * seq * score_forwards
    update = (4 if lora else 6) * matmul_params * rows * seq
    return {"sample": float(sample), "score": float(score), "train": float(update)}


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Per-device costs of one step's phases on `devices` chips of peak `peak_flops` FLOP/s and
    `hbm_bytes_per_s`; `tokens`: sequence tokens (prompt + response, full length) per step."""

    chip: str
    devices: int
    peak_flops: float
    hbm_bytes_per_s: float
    phases: dict[str, Cost]
    tokens: int
    model_flops: float

    def phase_seconds(self) -> dict[str, float]:
        return {k: c.seconds(self.peak_flops, self.hbm_bytes_per_s) for k, c in self.phases.items()}

    @property
    def step_seconds(self) -> float:
        return sum(self.phase_seconds().values())

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.tokens / self.step_seconds / self.devices if self.step_seconds else 0.0

    @property
    def mfu_ceiling(self) -> float:
        return self.model_flops / (self.step_seconds * self.peak_flops * self.devices) if self.step_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"chip": self.chip, "devices": self.devices, "step_seconds": self.step_seconds,
                "phase_seconds": self.phase_seconds(), "tokens_per_s_per_chip": self.tokens_per_s_per_chip,
                "mfu_ceiling": self.mfu_ceiling, "model_flops": self.model_flops, "tokens": self.tokens,
                "phases": {k: dataclasses.asdict(c) for k, c in self.phases.items()}}
