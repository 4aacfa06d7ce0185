"""A tiny random model learning the `repeat_digit` toy task: seconds per step, for tests and smoke runs."""

from kljax_base import base


def get_config():
    c = base()
    c.steps = 100
    c.checkpoint_every = 25
    c.eval_examples = 64  # the paired change's interval resolves the 100 steps' gain
    c.model.source = "tiny"
    c.task.name = "repeat_digit"
    c.task.eval_splits = "test"
    c.task.prompt_format = "raw"
    c.rl.group_size = 4
    c.rl.prompts_per_step = 8
    c.rl.max_prompt_len = 4
    c.rl.max_new_tokens = 6
    c.kl.beta = 0.01
    c.optim.learning_rate = 5e-3  # 1e-2 rose on some seeds and collapsed on others: docs/performance.md
    return c
