"""The task of a run config (`config.task`), and the check of every file row's prompt before compiling.

    task = task_from_config(config.task, config.seed, config.rl.temperature)   # registry task or a FileTask
    splits = eval_split_names(config.task, task)   # task.eval_splits, "" = the data's own evaluation split(s)
    dropped = check_prompts(task, config.task, config.rl, tokenizer)   # {split: rows dropped}
"""

from __future__ import annotations

from typing import Any

from kljax.config.rl import RLConfig
from kljax.config.run import RunConfig
from kljax.config.sections import TaskSection
from kljax.errors import UserError
from kljax.tasks.base import Task
from kljax.tasks.files import FORMATS, FileTask
from kljax.tasks.prompting import prompt_texts
from kljax.tasks.registry import get_task, task_names


def task_from_config(t: TaskSection, seed: int = 0, temperature: float = 1.0) -> Task:
    """The task `t` names, with its prompt settings (answer format, system prompt) applied. `seed`
    orders a data file's rows; `temperature` (rl.temperature) is the toy_optimum task's policy's."""
    if t.name in FORMATS:
        task: Task = FileTask(
            t.name, t.path, prompt_key=t.prompt_key, answer_key=t.answer_key, messages_key=t.messages_key,
            eval_fraction=t.eval_fraction, prompt_template=t.prompt_template, system_prompt=t.system_prompt,
            seed=seed,
        )
    else:
        if t.name not in task_names():
            raise UserError(f"config.task.name={t.name!r} is not valid; choose a task {task_names()} or a data "
                            f"format {sorted(FORMATS)} with config.task.path")
        kwargs: dict[str, Any] = {"data_dir": t.data_dir} if t.data_dir else {}
        if t.name == "toy_optimum":  # its options are config.task.toy; its exact metrics follow rl.temperature
            kwargs = dict(shapes=t.toy.shapes, vocab=t.toy.vocab, response_len=t.toy.response_len,
                          temperature=temperature)
        try:
            task = get_task(t.name, **kwargs)
        except TypeError:  # generated tasks take no data_dir
            task = get_task(t.name)
        if t.system_prompt is not None:
            task.system_prompt = t.system_prompt or None  # read by `prompt_texts`; None: no system message
    if t.answer_format:
        task.answer_format = t.answer_format
    return task


def task_of(config: RunConfig) -> Task:
    """The task of a run config (`task_from_config` with its seed and rl.temperature)."""
    return task_from_config(config.task, config.seed, config.rl.temperature)


def eval_split_names(t: TaskSection, task: Task) -> list[str]:
    """The splits t.eval_splits names, each checked; "" = the task's own evaluation splits (a data
    file's test/validation split, none when all its rows train; a built-in task's splits but train)."""
    names = list(t.eval_split_names)
    if not names:
        own = getattr(task, "default_eval_splits", None)
        names = list(own) if own is not None else [s for s in task.splits if s != t.split]
    for name in names:
        task.validate_split(name)
    return names


def check_prompts(task: Task, t: TaskSection, rl: RLConfig, tokenizer: Any,
                  splits: list[str] | None = None, context: int | None = None) -> dict[str, int]:
    """Render and tokenize every row's prompt of a FileTask's `splits` (default: all). Prompts longer than
    rl.max_prompt_len tokens are a ValueError naming the longest one's file and row and the value that
    fits them (within `context` - rl.max_new_tokens, the model's room), or, with task.drop_overlong, are
    dropped; one the tokenizer cannot encode is a ValueError naming its row. Returns {split: rows
    dropped}; other tasks: {}."""
    if not isinstance(task, FileTask):
        return {}
    max_len = rl.max_prompt_len
    drop = t.drop_overlong
    lengths: dict[str, list[int]] = {}
    longest: tuple[int, str] = (0, "")
    for split in splits or list(task.splits):
        texts = prompt_texts(task.examples(split), task, tokenizer, t.prompt_format)
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
                                           f"{context - rl.max_new_tokens} with rl.max_new_tokens="
                                           f"{rl.max_new_tokens})")
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
