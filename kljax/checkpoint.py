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


def _abstract(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying the target shardings, for restoring."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


class RunCheckpointer:
    """Save and restore {state, meta} under `directory`, keeping the last `keep` checkpoints."""

    def __init__(self, directory: str | os.PathLike, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"checkpoint keep={keep} must be >= 1")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write checkpoint `step` (blocking: when this returns the checkpoint is complete)."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def restore(self, step: int, like_state: Any, shardings: Any) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of checkpoint `step`, arrays placed on `shardings` (same structure as like_state)."""
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract(like_state, shardings)), meta=ocp.args.JsonRestore()
        )
        out = self._manager.restore(step, args=args)
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        self._manager.close()
