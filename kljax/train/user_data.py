"""Fitting a run config to the user's own data (a data-file task), before the run is built.

    config = restart_task_for_user_data(config, "repeat_digit", explicit)   # a built-in task's settings dropped
    config = fit_prompt_len(config, explicit)                               # rl.max_prompt_len from the data

A config file written for a built-in task (configs/tiny.py: repeat_digit, raw prompts, evaluation
split "test", prompts of 4 tokens) keeps those settings to itself: with the user's data they go
back to the defaults, except the ones set explicitly, and the run says which. rl.max_prompt_len left
at its default becomes the longest prompt of the data after templating.
"""

from __future__ import annotations

import dataclasses
import sys

from kljax.config.run import RunConfig
from kljax.tasks.files import FORMATS
from kljax.tasks.from_config import task_of
from kljax.tasks.prompting import prompt_texts
from kljax.train.policy import model_and_tokenizer


def restart_task_for_user_data(config: RunConfig, builtin_task: str, explicit: set[str]) -> RunConfig:
    """`config` with the task fields (and rl.max_prompt_len) that a built-in task's config set, and the
    user did not, back at their defaults, when the run's data is the user's."""
    if builtin_task in FORMATS or config.task.name not in FORMATS:
        return config
    defaults = RunConfig()
    task, reset = {}, []
    for f in dataclasses.fields(config.task):
        value, default = getattr(config.task, f.name), getattr(defaults.task, f.name)
        if f"task.{f.name}" not in explicit and value != default:
            task[f.name] = default
            reset.append(f"task.{f.name}={value!r}")
    rl = {}
    if "rl.max_prompt_len" not in explicit and config.rl.max_prompt_len != defaults.rl.max_prompt_len:
        rl["max_prompt_len"] = defaults.rl.max_prompt_len
        reset.append(f"rl.max_prompt_len={config.rl.max_prompt_len!r}")
    if not reset:
        return config
    print(f"kljax train: the data is yours (task {config.task.name!r}), so the settings made for task "
          f"{builtin_task!r} are not used: {', '.join(reset)} (set any of them explicitly to keep it, e.g. "
          f"config={{{reset[0].split('=')[0]!r}: ...}})", file=sys.stderr, flush=True)
    return config.replace(task=dataclasses.replace(config.task, **task), rl=dataclasses.replace(config.rl, **rl))


def auto_prompt_len(config: RunConfig, explicit: set[str]) -> int | None:
    """rl.max_prompt_len for the user's data when it is left at the default: the longest prompt after
    templating, at most the model's context minus rl.max_new_tokens; None when that does not apply (a
    built-in task, a value chosen) or cannot be told (a prompt the tokenizer cannot encode: the
    trainer's own check names it)."""
    if (config.task.name not in FORMATS or "rl.max_prompt_len" in explicit
            or config.rl.max_prompt_len != RunConfig().rl.max_prompt_len):
        return None
    task = task_of(config)
    model, tokenizer = model_and_tokenizer(config.model, task)
    try:
        longest = max(len(tokenizer.encode(text, add_special_tokens=False)) for split in task.splits
                      for text in prompt_texts(task.examples(split), task, tokenizer, config.task.prompt_format))
    except ValueError:
        return None
    room = int(getattr(model, "max_position_embeddings", 0) or 0) - config.rl.max_new_tokens
    return max(1, min(longest, room)) if room >= 1 else longest


def fit_prompt_len(config: RunConfig, explicit: set[str]) -> RunConfig:
    """`config` with rl.max_prompt_len from `auto_prompt_len`, said; unchanged when it does not apply."""
    fitted = auto_prompt_len(config, explicit)
    if fitted is None or fitted == config.rl.max_prompt_len:
        return config
    print(f"kljax train: rl.max_prompt_len={fitted}: the longest prompt of the data after templating (capped by "
          "the model's context; set rl.max_prompt_len to choose)", flush=True)
    return config.replace(rl=dataclasses.replace(config.rl, max_prompt_len=fitted))
