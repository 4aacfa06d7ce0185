"""What a resumed run may change: fields that do not mix two runs (length, evaluation, logging,
checkpoint cadence, mesh, memory settings). Any other difference between WORKDIR/config.json and
the new config (model, task, KL configuration and beta, optimizer, seed, group size, dtypes, ...)
is refused, naming the fields."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kljax.errors import UserError, read_json

SAFE_FIELDS = (
    "steps", "eval_every", "eval_examples", "task.eval_splits", "log_samples_every", "log_samples_n",
    "checkpoint_every", "keep_checkpoints", "max_nonfinite_steps", "mesh.", "model.remat", "rl.micro_batches",
    "logging.",
)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _safe(name: str) -> bool:
    return any(name == f or (f.endswith(".") and name.startswith(f)) for f in SAFE_FIELDS)


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted names of the fields in both configs whose values differ (a field only one side has,
    e.g. one added to kljax since the run started, is not compared)."""
    a, b = _flat(old), _flat(json.loads(json.dumps(new, default=str)))
    return sorted(k for k in set(a) & set(b) if a[k] != b[k])


def _schedule_length(config: dict[str, Any]) -> tuple[str, Any]:
    """(optim.schedule, the steps it decays over): optim.total_steps, which defaults to `steps`."""
    optim = config.get("optim") if isinstance(config.get("optim"), dict) else {}
    return str(optim.get("schedule", "constant")), optim.get("total_steps", config.get("steps"))


def check_schedule(old: dict[str, Any], new: dict[str, Any], workdir: object) -> None:
    """A UserError when the learning-rate schedule's length would change: a cosine or linear decay
    over optim.total_steps (= steps unless set) that a new `steps` stretches or shortens, so the
    resumed steps would run at other rates than the run's."""
    schedule, before = _schedule_length(old)
    _, after = _schedule_length(json.loads(json.dumps(new, default=str)))
    if schedule in ("cosine", "linear") and before is not None and after is not None and before != after:
        raise UserError(
            f"--resume would change the learning-rate schedule of {workdir}: its {schedule} decay runs over "
            f"optim.total_steps (= steps unless set) {before} -> {after}, so every resumed step would get another "
            f"rate than the run's; pass --config.optim.total_steps={before} to keep it (the rate stays at its final "
            "value past it) or use a new --workdir"
        )


def check_resume(old: dict[str, Any], new: dict[str, Any], workdir: object) -> list[str]:
    """The safe fields that changed; a UserError naming the unsafe ones when there are any (or when
    the learning-rate schedule's length changes: `check_schedule`)."""
    check_schedule(old, new, workdir)
    changed = changed_fields(old, new)
    unsafe = [k for k in changed if not _safe(k)]
    if unsafe:
        a, b = _flat(old), _flat(json.loads(json.dumps(new, default=str)))
        shown = ", ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in unsafe[:8])
        raise UserError(
            f"--resume would mix two runs: {workdir}/config.json differs in {shown}"
            f"{' ...' if len(unsafe) > 8 else ''}; only {', '.join(f.rstrip('.') for f in SAFE_FIELDS)} may "
            "change on resume (use a new --workdir for a different run)"
        )
    return [k for k in changed if _safe(k)]


def check_resume_workdir(workdir: str | os.PathLike, new: dict[str, Any], record: bool = True) -> list[str]:
    """`check_resume` against WORKDIR/config.json (a UserError when it is absent: nothing would say
    which fields changed); with `record`, write the new config there and print the safe fields that
    changed. Returns them."""
    path = Path(workdir) / "config.json"
    if not path.is_file():
        raise UserError(f"--resume: {path} is missing, so nothing can check that this config is the run's "
                        "(model, task, KL, optimizer, seed, ...); put the run's config.json back, or start a new "
                        "--workdir")
    old = read_json(path, "run config")
    if not isinstance(old, dict):
        raise UserError(f"run config {path} holds a {type(old).__name__}, not a JSON object")
    changed = check_resume(old, new, workdir)
    if changed and record:
        flat_old, flat_new = _flat(old), _flat(json.loads(json.dumps(new, default=str)))
        shown = ", ".join(f"{k}: {flat_old[k]!r} -> {flat_new[k]!r}" for k in changed)
        print(f"kljax train: resuming with {shown} (recorded in {path})", file=sys.stderr, flush=True)
        tmp = path.with_name(".config.json.tmp")
        tmp.write_text(json.dumps(new, indent=2, default=str))
        os.replace(tmp, path)
    return changed
