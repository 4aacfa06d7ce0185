"""The task of a run config (`config.task`), and the check of every file row's prompt before compiling.

    task = task_from_config(config)            # registry task, or a FileTask for jsonl/parquet/csv/hf
    dropped = check_prompts(task, config, tokenizer)   # {split: rows dropped}; ValueError naming file and row
"""

from __future__ import annotations

from typing import Any

import ml_collections

from kljax.tasks.base import Task
from kljax.tasks.files import FORMATS, FileTask


def task_from_config(config: ml_collections.ConfigDict) -> Task:
    """The task config.task names, with its prompt settings (answer format, system prompt) applied."""
    from kljax.tasks.registry import get_task, task_names

    t = config.task
    name = str(t.name)
    system_prompt = t.get("system_prompt", None)
    if name in FORMATS:
        task: Task = FileTask(
            name, str(t.get("path", "")), prompt_key=str(t.get("prompt_key", "prompt")),
            answer_key=str(t.get("answer_key", "") or ""), messages_key=str(t.get("messages_key", "") or ""),
            eval_fraction=float(t.get("eval_fraction", 0.1)), prompt_template=str(t.get("prompt_template", "") or ""),
            system_prompt=system_prompt, seed=int(config.get("seed", 0)),
        )
    else:
        if name not in task_names():
            raise ValueError(f"config.task.name={name!r} is not valid; choose a task {task_names()} or a data "
                             f"format {sorted(FORMATS)} with config.task.path")
        kwargs = {"data_dir": t.data_dir} if t.get("data_dir") else {}
        if name == "toy_optimum":  # its options are config.task.toy
            kwargs = dict(t.get("toy", {}))
        try:
            task = get_task(name, **kwargs)
        except TypeError:  # generated tasks take no data_dir
            task = get_task(name)
        if system_prompt is not None:
            task.system_prompt = system_prompt or None  # read by `rollout.prompt_texts`; None: no system message
    if t.get("answer_format"):
        task.answer_format = t.answer_format
    return task


def check_prompts(task: Task, config: ml_collections.ConfigDict, tokenizer: Any,
                  splits: list[str] | None = None) -> dict[str, int]:
    """Render and tokenize every row's prompt of a FileTask's `splits` (default: all); a prompt longer than
    rl.max_prompt_len tokens (or one the tokenizer cannot encode) is a ValueError naming its file and row,
    or, with task.drop_overlong, is dropped. Returns {split: rows dropped}; other tasks: {}."""
    from kljax.train.rollout import prompt_texts

    if not isinstance(task, FileTask):
        return {}
    max_len = int(config.rl.max_prompt_len)
    drop = bool(config.task.get("drop_overlong", False))
    dropped = {}
    for split in splits or list(task.splits):
        rows = task.rows(split)
        examples = task.examples(split)
        texts = prompt_texts(examples, task, tokenizer, str(config.task.prompt_format))
        bad = []
        for i, (row, text) in enumerate(zip(rows, texts, strict=True)):
            where = f"{row.where}, row {row.index + 1}"
            try:
                n = len(tokenizer.encode(text, add_special_tokens=False))
            except ValueError as e:
                raise ValueError(f"{where}: the prompt cannot be tokenized: {e}") from None
            if n > max_len:
                if not drop:
                    raise ValueError(f"{where}: the prompt has {n} tokens after templating, more than "
                                     f"rl.max_prompt_len={max_len}; raise it, shorten the prompt, or set "
                                     "task.drop_overlong=True to leave such rows out")
                bad.append(i)
            elif n == 0:
                raise ValueError(f"{where}: the prompt is empty after tokenization")
        if bad:
            task.drop(split, bad)
        dropped[split] = len(bad)
    return dropped
