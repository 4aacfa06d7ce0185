"""The paper's on-policy study with Llama-3.1-8B-Instruct on MATH (RLOO); see paper_qwen25_7b_math.py
for which values are the paper's and which are guesses (marked GUESS)."""

from kljax_base import base


def get_config():
    c = base()
    c.steps = 250                       # GUESS (secondary source)
    c.checkpoint_every = 25
    c.eval_examples = 500
    c.model.source = "/path/to/Llama-3.1-8B-Instruct"  # set on the command line
    c.model.dtype = "bfloat16"          # GUESS
    c.model.remat = "full"              # GUESS
    c.task.name = "math"
    c.task.eval_splits = "test"
    c.task.prompt_format = "chat"
    c.kl.estimator = "k1"
    c.kl.placement = "reward"
    c.kl.beta = 0.05                    # grid {0, 0.05, 0.1, 0.3, 1} (secondary source)
    c.rl.advantage = "rloo"
    c.rl.group_size = 5                 # GUESS (secondary source)
    # OUR CHOICE (the paper does not state its aggregation): a constant normalizer, so every term of
    # the loss is weighted alike and the gradient is grad J / max_new_tokens (`kljax kl-configs`).
    c.rl.loss_aggregation = "seq-mean-token-sum-norm"
    c.rl.prompts_per_step = 64          # GUESS: 320 sequences, so micro-batches split over 8-32 devices
    c.rl.max_prompt_len = 512           # GUESS
    c.rl.max_new_tokens = 1024          # GUESS
    c.rl.micro_batches = 10             # GUESS: memory; 32 sequences per micro-batch
    c.optim.learning_rate = 1e-6        # GUESS
    c.optim.warmup_steps = 10           # GUESS
    return c
