"""What the training loop tells observers, and what they may ask of it.

The loop (`kljax.train.trainer`) calls each `LoopObserver` method at its moment with one
`LoopState` (global_step, max_steps, epoch, log_history) and one `LoopControl` whose flags it
honours: should_training_stop ends the run after the step (checkpointing first), should_save
checkpoints after it, should_evaluate evaluates after it. The flags are reset after each step.
transformers' `TrainerCallback`s are adapted to this (`kljax.api.trl_callbacks`); the fault boundary checks for
a lost Ctrl-C at every step_begin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass
class LoopState:
    """global_step: steps done; max_steps: the run's steps; epoch: passes over the training rows
    (file tasks; else 0); log_history: the metrics rows logged so far (one dict per step)."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    log_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LoopControl:
    should_training_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False

    def reset_step(self) -> None:
        self.should_save = self.should_evaluate = False


class LoopObserver:
    """Override any of these; each is called on process 0's loop and every other process's alike."""

    def on_train_begin(self, state: LoopState, control: LoopControl) -> None: ...

    def on_step_begin(self, state: LoopState, control: LoopControl) -> None: ...

    def on_step_end(self, state: LoopState, control: LoopControl) -> None: ...

    def on_log(self, state: LoopState, control: LoopControl, logs: Mapping[str, float]) -> None: ...

    def on_evaluate(self, state: LoopState, control: LoopControl, metrics: Mapping[str, Any]) -> None: ...

    def on_save(self, state: LoopState, control: LoopControl) -> None: ...

    def on_train_end(self, state: LoopState, control: LoopControl) -> None: ...

    def reward_state(self, state: LoopState, trainer_state: Any) -> Any:
        """The `trainer_state` the reward functions get (None: kljax's own `trainer_state`)."""
        return None


class Observers:
    """Calls every observer's method in order."""

    def __init__(self, observers: Sequence[LoopObserver] = ()) -> None:
        self.observers = list(observers)
        self.state, self.control = LoopState(), LoopControl()

    def reward_state(self, trainer_state: Any) -> Any:
        """The first observer's `reward_state`, else `trainer_state` itself."""
        for observer in self.observers:
            chosen = observer.reward_state(self.state, trainer_state)
            if chosen is not None:
                return chosen
        return trainer_state

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)

        def call(*args: Any) -> None:
            for observer in self.observers:
                getattr(observer, name)(self.state, self.control, *args)

        return call
