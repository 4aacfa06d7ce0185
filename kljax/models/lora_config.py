"""The LoRA settings (`model.lora`), apart from `kljax.models.lora` so that `ModelConfig` can hold them."""

from __future__ import annotations

import dataclasses
import math

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank r >= 1, alpha (the scale is alpha / r), targets: a tuple of `TARGETS` names."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"model.lora.rank={self.rank!r} must be an integer >= 1 (0 turns LoRA off)")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"model.lora.alpha={self.alpha!r} must be a number > 0")
        bad = [t for t in self.targets if t not in TARGETS]
        if bad or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"model.lora.targets={','.join(self.targets)!r}: {bad or 'empty or repeated'} not valid; "
                             f"a comma-separated subset of {','.join(TARGETS)}")

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank
