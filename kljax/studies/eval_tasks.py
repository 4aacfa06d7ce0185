"""The task splits `kljax eval` evaluates, for any run config: its own task (file tasks included) or
"name:split" specs.

A spec naming the run's own task ("jsonl:test" for a run on a JSONL file, "arithmetic:ood_ops" for
a run on arithmetic) uses the task as the run built it from its config (files, keys, templates,
system prompt, answer format); other specs go to the registry (`kljax.studies.evaluate.parse_tasks`).
"""

from __future__ import annotations

from kljax.config.run import RunConfig
from kljax.errors import UserError
from kljax.studies.evaluate import Split, parse_tasks
from kljax.tasks.files import FORMATS
from kljax.tasks.from_config import task_of


def splits_for(config: RunConfig, specs: str | None = None) -> list[Split]:
    """Splits of `specs` (comma-separated name[:split]), default the config's task and eval_splits."""
    name = config.task.name
    if specs is None:
        specs = ",".join(f"{name}:{s}" for s in config.task.eval_split_names) or name
        # eval_splits "": the task's own evaluation splits
    own, others = [], []
    for item in filter(None, (s.strip() for s in specs.split(","))):
        item_name = item.partition(":")[0].strip()
        (own if item_name in FORMATS or item_name == name else others).append(item)
    out: list[Split] = []
    if own:
        if any(i.partition(":")[0].strip() != name for i in own):
            raise UserError(f"--tasks {own[0]!r}: a data format names the run's own file task, but this run's "
                             f"task is {name!r}")
        task = task_of(config)
        for item in own:
            split = item.partition(":")[2].strip()
            chosen = [split] if split else [s for s in task.splits if s != "train"] or list(task.splits)
            for s in chosen:
                task.validate_split(s)
                out.append(Split(f"{name}:{s}", task, s))
    if others:
        out.extend(parse_tasks(",".join(others), data_dir=config.task.data_dir))
    if not out:
        raise UserError(f"no task splits in {specs!r}; give e.g. arithmetic:test,arithmetic:ood_digits")
    return out
