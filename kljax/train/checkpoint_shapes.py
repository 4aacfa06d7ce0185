"""Does a checkpoint hold the arrays a config asks for? The shapes and dtypes that orbax recorded in
a step's state metadata, compared leaf by leaf with the abstract state the run config builds, before
anything is restored: a config changed (or a config.json edited) so that the model no longer
matches is named as that, one line, not reported as damage after orbax's failing reads.

    mismatch(step_dir / "state", like_state) -> None, or "train.params.embed: (19, 32) in the
                                                checkpoint, (19, 64) from the config (and 11 more)"
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import jax

from kljax.errors import UserError


class ConfigMismatch(UserError):
    """The run config builds a state whose arrays differ from the checkpoint's (not damage)."""


class CheckpointGone(UserError):
    """A checkpoint step was removed while it was read (a running job rotating its checkpoints)."""


def gone(step_dir: str | os.PathLike, wait_s: float = 0.5) -> bool:
    """Whether `step_dir` is gone (or being deleted: looked at again after `wait_s`), after a failed read."""
    import time

    if not os.path.isdir(step_dir):
        return True
    time.sleep(wait_s)
    return not os.path.isdir(step_dir)


def _name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def leaf_table(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """{"train.params.embed": (shape, dtype)} of every array leaf (dicts, lists, dataclasses and
    named tuples alike: each path step by its key, attribute name or index)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
    table = {}
    for path, leaf in leaves:
        if hasattr(leaf, "shape"):
            table[".".join(_name(e) for e in path)] = (tuple(leaf.shape), str(getattr(leaf, "dtype", "")))
    return table


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """orbax warns through absl about files a kljax step does not write (_CHECKPOINT_METADATA of the item)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def stored_table(state_dir: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """`leaf_table` of what orbax recorded in `state_dir` (None when its metadata cannot be read:
    the restore then reports what is wrong)."""
    import orbax.checkpoint as ocp

    try:
        with _quiet_absl():
            meta = ocp.PyTreeCheckpointer().metadata(os.fspath(state_dir))
    except Exception:  # noqa: BLE001 - a damaged or foreign checkpoint: the restore names the damage
        return None
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    table = leaf_table(tree)
    return table or None


def mismatch(state_dir: str | os.PathLike, like_state: Any) -> str | None:
    """None when the checkpoint's recorded arrays have the paths, shapes and dtypes of `like_state`
    (or its metadata is unreadable); else the first differences, named by path."""
    stored = stored_table(state_dir)
    if stored is None:
        return None
    wanted = leaf_table(like_state)
    problems = []
    for path in sorted(set(stored) | set(wanted), key=lambda p: (".params." not in f".{p}.", p)):
        if path not in wanted:
            problems.append(f"{path}: in the checkpoint, not in the config's state")
        elif path not in stored:
            problems.append(f"{path}: in the config's state, not in the checkpoint")
        elif stored[path][0] != wanted[path][0]:
            problems.append(f"{path}: shape {stored[path][0]} in the checkpoint, {wanted[path][0]} from the config")
        elif stored[path][1] and wanted[path][1] and stored[path][1] != wanted[path][1]:
            problems.append(f"{path}: dtype {stored[path][1]} in the checkpoint, {wanted[path][1]} from the config")
    if not problems:
        return None
    more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
    return "; ".join(problems[:2]) + more
