"""The paper's off-policy study: Qwen3-4B-Instruct-2507 on Countdown, asynchronous sampling 10 steps
stale, Dr. GRPO. The paper: KL regularization stabilizes training where no KL collapses.

Paper: off-policy (async), 10 steps stale, Dr. GRPO, Countdown, Qwen3-4B-Instruct-2507.
GUESSES (secondary sources): batch 512, 16 samples per prompt, beta 0.005. GUESSES (ours): the rest.
"""


def get_config():
    return {
        "steps": 250,                       # GUESS
        "checkpoint_every": 25,
        "keep_checkpoints": 2,
        "eval_examples": 512,
        "model": {
            "source": "/path/to/Qwen3-4B-Instruct-2507",  # set on the command line
            "dtype": "bfloat16",            # GUESS
            "remat": "full",                # GUESS
        },
        "task": {"name": "countdown", "eval_splits": "test,ood_numbers", "prompt_format": "chat"},
        "kl": {
            "estimator": "k3",              # with the token-ratio correction (DeepSeek-V3.2 eq. 7); compare k1/reward
            "placement": "loss",
            "off_policy": "token_ratio",
            "beta": 0.005,                  # GUESS (secondary source)
        },
        "rl": {
            "advantage": "dr_grpo",
            # Dr. GRPO's constant normalizer (OUR CHOICE: the paper names Dr. GRPO, not its aggregation).
            # With a stale sampler no setting is unbiased for grad J (`kljax kl-configs --async-level 10`).
            "loss_aggregation": "seq-mean-token-sum-norm",
            "group_size": 16,               # GUESS (secondary source)
            "prompts_per_step": 32,         # GUESS: 512 sequences (secondary source)
            "async_level": 10,              # the paper: 10 steps stale
            "max_prompt_len": 256,          # GUESS
            "max_new_tokens": 1024,         # GUESS
            "temperature": 1.0,             # GUESS
            "micro_batches": 32,            # GUESS: memory
        },
        "optim.learning_rate": 1e-6,        # GUESS
    }
