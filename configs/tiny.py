"""A tiny random model learning the `repeat_digit` toy task: seconds per step, for tests and smoke runs."""


def get_config():
    return {
        "steps": 100,
        "checkpoint_every": 25,
        "keep_checkpoints": 2,
        "eval_examples": 64,  # the paired change's interval resolves the 100 steps' gain
        "model.source": "tiny",
        "task": {"name": "repeat_digit", "eval_splits": "test", "prompt_format": "raw"},
        "rl": {"group_size": 4, "prompts_per_step": 8, "max_prompt_len": 4, "max_new_tokens": 6, "temperature": 1.0},
        "kl.beta": 0.01,
        "optim.learning_rate": 5e-3,  # 1e-2 rose on some seeds and collapsed on others: docs/experiments.md
    }
