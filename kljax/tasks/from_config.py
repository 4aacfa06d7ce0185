"""The task of a run config (`config.task`), and the check of every file row's prompt before compiling.

    task = task_from_config(config)            # registry task, or a FileTask for jsonl/parquet/csv/hf
    splits = eval_split_names(config, task)    # task.eval_splits, "" = the data's own evaluation split(s)
    dropped = check_prompts(task, config, tokenizer)   # {split: rows dropped}; ValueError naming the longest row
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
        if name == "toy_optimum":  # its options are config.task.toy; its exact metrics follow rl.temperature
            kwargs = dict(t.get("toy", {}))
            kwargs["temperature"] = float(config.get("rl", {}).get("temperature", 1.0))
        try:
            task = get_task(name, **kwargs)
        except TypeError:  # generated tasks take no data_dir
            task = get_task(name)
        if system_prompt is not None:
            task.system_prompt = system_prompt or None  # read by `rollout.prompt_texts`; None: no system message
    if t.get("answer_format"):
        task.answer_format = t.answer_format
    return task


def eval_split_names(config: ml_collections.ConfigDict, task: Task) -> list[str]:
    """The splits config.task.eval_splits names, each checked; "" = the task's own evaluation splits (a data
    file's test/validation split, none when all its rows train; a built-in task's splits but train)."""
    from kljax.errors import UserError

    text = str(config.task.get("eval_splits", "") or "")
    names = [s.strip() for s in text.split(",") if s.strip()]
    if text.strip() and not names:
        raise UserError(f"config.task.eval_splits={text!r} names no split; give split names, e.g. 'test', or '' "
                        "for the task's own evaluation splits")
    if not names:
        own = getattr(task, "default_eval_splits", None)
        train = str(config.task.get("split", "train"))
        names = list(own) if own is not None else [s for s in task.splits if s != train]
    for name in names:
        task.validate_split(name)
    return names


def check_prompts(task: Task, config: ml_collections.ConfigDict, tokenizer: Any,
                  splits: list[str] | None = None, context: int | None = None) -> dict[str, int]:
    """Render and tokenize every row's prompt of a FileTask's `splits` (default: all). Prompts longer than
    rl.max_prompt_len tokens are a ValueError naming the longest one's file and row and the value that
    fits them (within `context` - rl.max_new_tokens, the model's room), or, with task.drop_overlong, are
    dropped; one the tokenizer cannot encode is a ValueError naming its row. Returns {split: rows
    dropped}; other tasks: {}."""
    from kljax.tasks.prompting import prompt_texts

    if not isinstance(task, FileTask):
        return {}
    max_len = int(config.rl.max_prompt_len)
    drop = bool(config.task.get("drop_overlong", False))
    lengths: dict[str, list[int]] = {}
    longest: tuple[int, str] = (0, "")
    for split in splits or list(task.splits):
        texts = prompt_texts(task.examples(split), task, tokenizer, str(config.task.prompt_format))
        lengths[split] = []
        for row, text in zip(task.rows(split), texts, strict=True):
            where = f"{row.where}, row {row.index + 1}"
            try:
                n = len(tokenizer.encode(text, add_special_tokens=False))
            except ValueError as e:
                raise ValueError(f"{where}: the prompt cannot be tokenized: {e}") from None
            if n == 0:
                raise ValueError(f"{where}: the prompt is empty after tokenization")
            lengths[split].append(n)
            longest = max(longest, (n, where))
    over = sum(n > max_len for ns in lengths.values() for n in ns)
    if over and not drop:
        n, where = longest
        room = "" if context is None else (f" (the model's context of {context} leaves room for "
                                           f"{context - int(config.rl.max_new_tokens)} with rl.max_new_tokens="
                                           f"{int(config.rl.max_new_tokens)})")
        raise ValueError(f"{where}: the prompt has {n} tokens after templating, more than rl.max_prompt_len="
                         f"{max_len}, the longest of {over} such rows; set rl.max_prompt_len={n}{room}, shorten the "
                         "prompts, or set task.drop_overlong=True to leave such rows out")
    dropped = {}
    for split, ns in lengths.items():
        bad = [i for i, n in enumerate(ns) if n > max_len]
        if bad:
            task.drop(split, bad)
        dropped[split] = len(bad)
    return dropped
