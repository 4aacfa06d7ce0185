"""The run config: one frozen, typed value holding every setting of a run.

Its defaults are the default run (`kljax train` with no --config): SmolLM2-135M-Instruct on generated
arithmetic, k1 in the reward with RLOO. Every other config (a dict, a YAML/JSON/.py file, CLI
overrides) is these defaults with some fields changed (`kljax.config.load`), so the same fields give
the same config whichever form sets them. `to_dict()` is what WORKDIR/config.json holds;
`kljax.config.load.from_mapping` reads it back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kljax.config.rl import RLConfig
from kljax.config.sections import (
    LoggingSection,
    MeshSection,
    ModelSection,
    OptimConfig,
    RewardSection,
    TaskSection,
    at_least,
)
from kljax.errors import UserError
from kljax.rl.kl import KLConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of a run (see the module docstring). steps: RL iterations; checkpoint_every and
    keep_checkpoints: checkpoint cadence and how many stay on disk; max_nonfinite_steps: consecutive
    skipped (non-finite) updates that stop the run; eval_every: steps between evaluations (0: before
    and after only); eval_examples: problems per evaluation split (eval_examples_ood per ood* split;
    0: eval_examples); eval_samples: completions per problem at rl.temperature, the accuracy of the
    policy trained (0: greedy only); log_samples_every / _n: prompts and completions written to
    samples.jsonl.

    The default run's sizes: full fine-tuning at 1e-5 for 30 steps of 4 x 4 samples measurably learns
    (docs/experiments.md); 384 in-domain problems give 95% intervals of +-0.05 at most."""

    seed: int = 0
    steps: int = 30
    checkpoint_every: int = 10
    keep_checkpoints: int = 1
    max_nonfinite_steps: int = 5
    eval_every: int = 0
    eval_examples: int = 384
    eval_examples_ood: int = 64
    eval_samples: int = 2
    log_samples_every: int = 0
    log_samples_n: int = 4
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    reward: RewardSection = RewardSection()
    logging: LoggingSection = LoggingSection()
    kl: KLConfig = KLConfig()
    rl: RLConfig = RLConfig()
    optim: OptimConfig = OptimConfig()
    mesh: MeshSection = MeshSection()

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**31:
            raise UserError(f"config.seed={self.seed!r} must be an integer in [0, 2**31)")
        for name in ("steps", "checkpoint_every", "keep_checkpoints", "max_nonfinite_steps", "eval_examples",
                     "log_samples_n"):
            at_least(f"config.{name}", getattr(self, name), 1)
        for name, zero in (("eval_every", "off"), ("log_samples_every", "off"), ("eval_samples", "greedy only"),
                           ("eval_examples_ood", "eval_examples")):
            at_least(f"config.{name}", getattr(self, name), 0, f" (0: {zero})")

    @property
    def total_steps(self) -> int:
        """The steps the learning-rate schedule runs over: optim.total_steps, else steps."""
        return self.optim.total_steps or self.steps

    @property
    def run_optim(self) -> OptimConfig:
        """optim with total_steps resolved (the schedule's length)."""
        return dataclasses.replace(self.optim, total_steps=self.total_steps)

    def to_dict(self) -> dict[str, Any]:
        """The nested JSON-able dict of every field (tuples as lists): WORKDIR/config.json."""
        return _plain(dataclasses.asdict(self))

    def replace(self, **sections: Any) -> RunConfig:
        """A copy with whole fields or sections replaced (`dataclasses.replace`); for dotted field
        names from user input use `kljax.config.load.with_fields`."""
        return dataclasses.replace(self, **sections)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
