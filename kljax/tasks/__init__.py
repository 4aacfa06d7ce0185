"""Tasks and rewards: generated problems (arithmetic, countdown, DeepMind mathematics), loaders for
MATH, MATH500, GSM8K and MMLU, prompt building, answer extraction and reward checks.

    task = get_task("arithmetic")
    examples = task.examples("train", n=64, seed=0)
    prompts = [render_prompt(ex, task, tokenizer) for ex in examples]
    rewards, correct = score_batch(task, examples, completions)

Importing this package is light: `datasets`, `math_verify` and `mathematics_dataset` are imported
only when a loaded task reads data, a math reward is checked, or the dm_math task is built.
"""

from kljax.tasks.base import Example, GeneratedTask, Score, Task
from kljax.tasks.loaders import DATA_DIR_ENV, DataNotFoundError, default_data_dir, load_rows, resolve_data_dir
from kljax.tasks.pool import VerifierPool
from kljax.tasks.prompting import build_messages, has_chat_template, render_messages, render_prompt
from kljax.tasks.registry import TASKS, get_task, parse_task_spec, task_names
from kljax.tasks.rewards import check_choice, check_integer, check_math, score_batch

__all__ = [
    "DATA_DIR_ENV",
    "TASKS",
    "DataNotFoundError",
    "Example",
    "GeneratedTask",
    "Score",
    "Task",
    "VerifierPool",
    "build_messages",
    "check_choice",
    "check_integer",
    "check_math",
    "default_data_dir",
    "get_task",
    "has_chat_template",
    "load_rows",
    "parse_task_spec",
    "render_messages",
    "render_prompt",
    "resolve_data_dir",
    "score_batch",
    "task_names",
]
