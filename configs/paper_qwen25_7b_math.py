"""The paper's main on-policy study (arXiv 2512.21852): Qwen2.5-7B on MATH with RLOO, one gradient
step per batch, evaluated in-domain on MATH500 and out-of-domain on MMLU college physics/chemistry/
biology. Sweep kl.{estimator,placement} over k1/k3 x reward/loss (+ both) and kl.beta over
{0, 0.05, 0.1, 0.3, 1}.

Values the paper states: RLOO, on-policy, MATH train, MATH500 / MMLU OOD evaluation.
GUESSES (secondary sources, not the paper's text): group size 5, batch 256 sequences, 250 steps,
temperature 1.0, top-p 1.0. GUESSES (ours): learning rate, lengths, mesh, dtypes.
Model source: a local HF checkpoint directory (set --config.model.source=/path/to/Qwen2.5-7B).
"""


def get_config():
    return {
        "steps": 250,                       # guess (secondary source)
        "checkpoint_every": 25,
        "keep_checkpoints": 2,
        "eval_examples": 500,
        "model": {
            "source": "/path/to/Qwen2.5-7B",  # set on the command line
            "dtype": "bfloat16",            # guess
            "param_dtype": "float32",       # guess: fp32 master weights
            "remat": "full",                # guess
        },
        "task": {
            "name": "math",
            "split": "train",
            "eval_splits": "test",          # MATH500; MMLU OOD via `kljax eval`
            "prompt_format": "chat",
        },
        "kl": {"estimator": "k1", "placement": "reward", "beta": 0.05},  # beta grid {0, 0.05, 0.1, 0.3, 1}
        "rl": {
            "advantage": "rloo",
            "group_size": 5,                # guess (secondary source)
            # OUR CHOICE (the paper does not state its aggregation): a constant normalizer, so every term
            # of the loss is weighted alike and the gradient is grad J / max_new_tokens (`kljax kl-configs`).
            "loss_aggregation": "seq-mean-token-sum-norm",
            "prompts_per_step": 64,         # guess: 320 sequences, so micro-batches split over 8-32 devices
            "max_prompt_len": 512,          # guess
            "max_new_tokens": 1024,         # guess
            "temperature": 1.0,             # guess (secondary source)
            "top_p": 1.0,                   # guess (secondary source)
            "micro_batches": 10,            # guess: memory; 32 sequences per micro-batch
        },
        "optim": {"learning_rate": 1e-6, "warmup_steps": 10},  # guesses
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
    }
