"""transformers' `TrainerCallback`s called by kljax's loop, as `Trainer` calls them.

    observer = TrainerCallbacks([MyCallback()], args)   # args: the TRL config, or None
    kljax.train.trainer.train(..., observers=[observer])

Each callback method gets (args, state, control, **kwargs) with a real `transformers.TrainerState`
(global_step, max_steps, epoch, log_history, num_input_tokens_seen) and `TrainerControl`; the flags
a callback sets (should_training_stop, should_save, should_evaluate) are honoured by the loop. The
reward functions' `trainer_state` is that same `TrainerState`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kljax.errors import UserError
from kljax.train.events import LoopControl, LoopObserver, LoopState


class TrainerCallbacks(LoopObserver):
    """The loop's events as `TrainerCallback` calls (see the module docstring)."""

    def __init__(self, callbacks: Sequence[Any], args: Any = None) -> None:
        import transformers

        if isinstance(callbacks, (str, bytes, Mapping)) or not isinstance(callbacks, Sequence):
            raise UserError(f"RLTrainer: callbacks={callbacks!r} must be a list of transformers.TrainerCallback "
                            "objects (or classes)")
        self.callbacks = []
        for cb in callbacks:
            cb = cb() if isinstance(cb, type) and issubclass(cb, transformers.TrainerCallback) else cb
            if not isinstance(cb, transformers.TrainerCallback):
                raise UserError(f"RLTrainer: callbacks holds {cb!r}, a {type(cb).__name__}; each must be a "
                                "transformers.TrainerCallback (or its class)")
            self.callbacks.append(cb)
        self.args = args
        self.state = transformers.TrainerState()
        self.control = transformers.TrainerControl()

    def _sync(self, state: LoopState) -> None:
        self.state.global_step, self.state.max_steps, self.state.epoch = state.global_step, state.max_steps, state.epoch
        self.state.log_history = state.log_history

    def _call(self, event: str, state: LoopState | None, control: LoopControl | None, **kwargs: Any) -> None:
        if state is not None:
            self._sync(state)
        for cb in self.callbacks:
            out = getattr(cb, event)(self.args, self.state, self.control, **kwargs)
            if out is not None:
                self.control = out
        if control is not None:  # the flags the loop honours
            control.should_training_stop |= bool(self.control.should_training_stop)
            control.should_save |= bool(self.control.should_save)
            control.should_evaluate |= bool(self.control.should_evaluate)

    def init_end(self) -> None:
        self._call("on_init_end", None, None)

    def reward_state(self, state: LoopState, trainer_state: Any) -> Any:
        self.state.global_step, self.state.max_steps = trainer_state.global_step, trainer_state.max_steps
        self.state.epoch = trainer_state.epoch
        return self.state

    def on_train_begin(self, state: LoopState, control: LoopControl) -> None:
        self._call("on_train_begin", state, control)

    def on_step_begin(self, state: LoopState, control: LoopControl) -> None:
        self.control.should_save = self.control.should_evaluate = self.control.should_log = False
        self._call("on_step_begin", state, control)

    def on_step_end(self, state: LoopState, control: LoopControl) -> None:
        self._call("on_step_end", state, control)

    def on_log(self, state: LoopState, control: LoopControl, logs: Mapping[str, float]) -> None:
        tokens = logs.get("num_tokens")
        if isinstance(tokens, (int, float)):
            self.state.num_input_tokens_seen = int(tokens)
        self._call("on_log", state, control, logs=dict(logs))

    def on_evaluate(self, state: LoopState, control: LoopControl, metrics: Mapping[str, Any]) -> None:
        self._call("on_evaluate", state, control, metrics=dict(metrics))

    def on_save(self, state: LoopState, control: LoopControl) -> None:
        self._call("on_save", state, control)

    def on_train_end(self, state: LoopState, control: LoopControl) -> None:
        self._call("on_train_end", state, control)
