"""The paper's on-policy study with Llama-3.1-8B-Instruct on MATH (RLOO); see paper_qwen25_7b_math.py
for which values are the paper's and which are guesses (marked GUESS)."""


def get_config():
    return {
        "steps": 250,                       # GUESS (secondary source)
        "checkpoint_every": 25,
        "keep_checkpoints": 2,
        "eval_examples": 500,
        "model": {
            "source": "/path/to/Llama-3.1-8B-Instruct",  # set on the command line
            "dtype": "bfloat16",            # GUESS
            "remat": "full",                # GUESS
        },
        "task": {"name": "math", "eval_splits": "test", "prompt_format": "chat"},
        "kl": {"estimator": "k1", "placement": "reward", "beta": 0.05},  # beta grid {0, 0.05, 0.1, 0.3, 1}
        "rl": {
            "advantage": "rloo",
            "group_size": 5,                # GUESS (secondary source)
            # OUR CHOICE (the paper does not state its aggregation): a constant normalizer, so every term
            # of the loss is weighted alike and the gradient is grad J / max_new_tokens (`kljax kl-configs`).
            "loss_aggregation": "seq-mean-token-sum-norm",
            "prompts_per_step": 64,         # GUESS: 320 sequences, so micro-batches split over 8-32 devices
            "max_prompt_len": 512,          # GUESS
            "max_new_tokens": 1024,         # GUESS
            "temperature": 1.0,             # GUESS (secondary source)
            "micro_batches": 10,            # GUESS: memory; 32 sequences per micro-batch
        },
        "optim": {"learning_rate": 1e-6, "warmup_steps": 10},  # GUESSES
    }
