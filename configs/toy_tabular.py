"""The exact-optimum toy task on the tabular policy: `kljax train` logs the exact distance to pi*.

Three prompts (rewards: sparse, long, conflict), responses of up to 3 tokens over 3 ids (the last
stops), pi_ref = the policy's random start. Every metrics row has exact/gap = beta KL(pi || pi*),
exact/J, exact/reward, exact/kl_seq, exact/kl_opt (kljax/tasks/toy_optimum.py); exact_before.json
has them at pi_ref. The optimizer and batch are those of `kljax converge-study` (RLOO, AdamW, peak
learning rate 0.1 on a cosine schedule, 8 samples per prompt). Change the KL configuration on the command line, e.g.
`--config.kl.estimator=k3 --config.kl.placement=loss`; seconds per 100 steps.
"""

from kljax_base import base


def get_config():
    c = base()
    c.steps = 300
    c.checkpoint_every = 100
    c.eval_examples = 3  # greedy: is each prompt's most likely response its best one
    c.model.source = "tabular"
    c.task.name = "toy_optimum"
    c.task.split = "train"
    c.task.eval_splits = "train"
    c.task.prompt_format = "raw"
    c.rl.group_size = 8
    c.rl.prompts_per_step = 3  # every prompt once per step (prompt i % 3)
    c.rl.max_prompt_len = 1
    c.rl.max_new_tokens = 3  # = task.toy.response_len
    c.kl.beta = 0.1
    c.optim.learning_rate = 0.1
    c.optim.schedule = "cosine"
    c.optim.end_lr_fraction = 0.05
    c.mesh.fsdp = 1  # a few dozen sequences: every device holds the whole batch
    c.mesh.tensor = -1
    return c
