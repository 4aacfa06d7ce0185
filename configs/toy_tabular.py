"""The exact-optimum toy task on the tabular policy: `kljax train` logs the exact distance to pi*.

Three prompts (rewards: sparse, long, conflict), responses of up to 3 tokens over 3 ids (the last
stops), pi_ref = the policy's random start. Every metrics row has exact/gap = beta KL(pi || pi*),
exact/J, exact/reward, exact/kl_seq, exact/kl_opt (kljax/tasks/toy_optimum.py); exact_before.json
has them at pi_ref. The optimizer and batch are those of `kljax converge-study` (RLOO, AdamW, peak
learning rate 0.1 on a cosine schedule, 8 samples per prompt). Change the KL configuration on the
command line, e.g. `--config.kl.estimator=k3 --config.kl.placement=loss`; seconds per 100 steps.
"""


def get_config():
    return {
        "steps": 300,
        "checkpoint_every": 100,
        "keep_checkpoints": 2,
        "eval_examples": 3,  # greedy: is each prompt's most likely response its best one
        "model.source": "tabular",
        "task": {"name": "toy_optimum", "split": "train", "eval_splits": "train", "prompt_format": "raw"},
        "rl": {
            "group_size": 8,
            "prompts_per_step": 3,  # every prompt once per step (prompt i % 3)
            "max_prompt_len": 1,
            "max_new_tokens": 3,  # = task.toy.response_len
            "temperature": 1.0,
        },
        "kl.beta": 0.1,
        "optim": {"learning_rate": 0.1, "schedule": "cosine", "end_lr_fraction": 0.05},
        "mesh": {"fsdp": 1, "tensor": -1},  # a few dozen sequences: every device holds the whole batch
    }
