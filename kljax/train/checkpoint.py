"""Run checkpoints with orbax: train state (+ off-policy sampler snapshots) and JSON metadata.

A checkpoint is a step directory written by `orbax.checkpoint.CheckpointManager`, which writes to a
temporary directory and renames it only when complete, so a run killed mid-write never leaves a
checkpoint that `latest_step` would pick. Arrays are restored directly into the shardings asked
for (a checkpoint written on one mesh restores onto another).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from kljax.errors import UserError, disk_fault
from kljax.train.checkpoint_integrity import PROMISE, damage, write_checksums
from kljax.train.checkpoint_shapes import CheckpointGone, ConfigMismatch, gone, mismatch
from kljax.train.orbax_quiet import drop_abandoned_write_callbacks, quiet_orbax_threads


def _abstract(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying the target shardings, for restoring."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


class CheckpointWriteError(OSError):
    """A checkpoint save failed on a disk fault (its cause); `what` names the checkpoint, so the
    command line says `cannot write WHAT: the file system is read-only ...` (`kljax.boundary`)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"cannot write {what}")
        self.what = what


class RunCheckpointer:
    """Save and restore {state, meta} under `directory`, keeping the last `keep` checkpoints."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"checkpoint keep={keep} must be >= 1")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._closed = False

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write checkpoint `step` (blocking: when this returns the checkpoint is complete), then its
        checksums.json (`kljax.train.checkpoint_integrity`, by process 0), which the meta promises
        (`PROMISE`), so the step is never restored without it."""
        meta = {**meta, PROMISE: True}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        try:
            with quiet_orbax_threads():  # a full or read-only disk: one line below, not orbax's thread logs
                self._manager.save(step, args=args, force=True)
                self._manager.wait_until_finished()
        except Exception as e:
            if disk_fault(e) is None:
                raise
            drop_abandoned_write_callbacks()  # tensorstore writes still in flight end after the loop closed
            raise CheckpointWriteError(f"the checkpoint of step {step} in {self.directory}") from e
        if jax.process_index() == 0:
            write_checksums(self.step_dir(step))

    def restore_intact(self, like_state: Any, shardings: Any, *, strict: bool = False,
                       ) -> tuple[int, Any, dict[str, Any], list[tuple[int, str]]]:
        """(step, state, meta, damaged) of the newest checkpoint that verifies and restores.

        damaged: (step, what is wrong) of each newer one, moved to DIRECTORY.damaged/STEP (STEP.1, ...
        when an earlier one of that step is there) so that
        the run continues from the intact one. With `strict`, a damaged latest checkpoint is a
        UserError instead. No intact checkpoint at all is a UserError listing what is wrong."""
        damaged: list[tuple[int, str]] = []
        for step in sorted(self.all_steps(), reverse=True):
            why = damage(self.step_dir(step))
            if why is None:
                try:
                    state, meta = self.restore(step, like_state, shardings, verify=False)
                    if damaged:
                        self._set_aside([s for s, _ in damaged])
                    return step, state, meta, damaged
                except ConfigMismatch:  # the config changed, not the checkpoint: no older one fits either
                    raise
                except Exception as e:  # orbax/tensorstore raise many types for damaged files
                    why = f"orbax cannot restore it: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            if gone(self.step_dir(step)):  # removed while read (rotated away), not damaged
                continue
            if strict:
                raise UserError(f"checkpoint at step {step} in {self.directory} is damaged ({why}); "
                                "refused by --resume=strict (plain --resume falls back to the newest intact one)")
            damaged.append((step, why))
        listed = "; ".join(f"step {s}: {w}" for s, w in damaged)
        raise UserError(f"no intact checkpoint in {self.directory} ({listed or 'none written'})")

    def _set_aside(self, steps: list[int]) -> None:
        if jax.process_index() == 0:
            aside = self.directory.with_name(self.directory.name + ".damaged")
            aside.mkdir(exist_ok=True)
            for step in steps:
                target, n = aside / str(step), 0
                while target.exists() or target.is_symlink():  # an earlier set-aside of this step: kept too
                    n += 1
                    target = aside / f"{step}.{n}"
                os.replace(self.step_dir(step), target)
        self._manager.reload()

    def restore(self, step: int, like_state: Any, shardings: Any, *, verify: bool = True,
                ) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of checkpoint `step`, arrays placed on `shardings` (same structure as like_state).
        With `verify`, a step whose files do not match its checksums.json, or that orbax cannot
        restore, is a UserError naming it."""
        if verify:
            why = damage(self.step_dir(step))
            error: Exception | None = None
            if why is None:
                try:
                    return self.restore(step, like_state, shardings, verify=False)
                except ConfigMismatch:
                    raise
                except Exception as e:  # orbax/tensorstore raise many types for damaged or mismatched files
                    error = e
            if gone(self.step_dir(step)):  # rotated away by a running job while read: not damage
                self._manager.reload()
                raise CheckpointGone(
                    f"checkpoint at step {step} in {self.directory} was removed while it was read (a running "
                    f"`kljax train` keeps only its newest checkpoints); steps there now: {self.all_steps()}")
            if error is not None:
                raise UserError(f"checkpoint at step {step} in {self.directory} cannot be restored: "
                                f"{type(error).__name__}: {' '.join(str(error).split())[:300]}") from error
            raise UserError(f"checkpoint at step {step} in {self.directory} is damaged: {why}")
        why = mismatch(self.step_dir(step) / "state", like_state)  # before orbax reads an array
        if why is not None:
            raise ConfigMismatch(
                f"the run config does not match the checkpoint at step {step} in {self.directory}: {why}; the "
                "config (or the workdir's config.json) changed the model or optimizer since it was written: "
                "restore it, or train in a new --workdir")
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract(like_state, shardings)), meta=ocp.args.JsonRestore()
        )
        out = self._manager.restore(step, args=args)
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        """Wait for a save in flight and release the manager; again: nothing."""
        if not self._closed:
            self._closed = True
            self._manager.close()
