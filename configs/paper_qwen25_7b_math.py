"""The paper's main on-policy study (arXiv 2512.21852): Qwen2.5-7B on MATH with RLOO, one gradient
step per batch, evaluated in-domain on MATH500 and out-of-domain on MMLU college physics/chemistry/
biology. Sweep kl.{estimator,placement} over k1/k3 x reward/loss (+ both) and kl.beta over
{0, 0.05, 0.1, 0.3, 1}.

Values the paper states: RLOO, on-policy, MATH train, MATH500 / MMLU OOD evaluation.
GUESSES (secondary sources, not the paper's text): group size 5, batch 256 sequences, 250 steps,
temperature 1.0, top-p 1.0. GUESSES (ours): learning rate, lengths, mesh, dtypes.
Model source: a local HF checkpoint directory (set --config.model.source=/path/to/Qwen2.5-7B).
"""

from kljax_base import base


def get_config():
    c = base()
    c.steps = 250                       # guess (secondary source)
    c.checkpoint_every = 25
    c.eval_examples = 500
    c.model.source = "/path/to/Qwen2.5-7B"  # set on the command line
    c.model.dtype = "bfloat16"          # guess
    c.model.param_dtype = "float32"     # guess: fp32 master weights
    c.model.remat = "full"              # guess
    c.task.name = "math"
    c.task.split = "train"
    c.task.eval_splits = "test"         # MATH500; MMLU OOD via `kljax eval`
    c.task.prompt_format = "chat"
    c.kl.estimator = "k1"
    c.kl.placement = "reward"
    c.kl.beta = 0.05                    # grid {0, 0.05, 0.1, 0.3, 1} (secondary source)
    c.rl.advantage = "rloo"
    c.rl.group_size = 5                 # guess (secondary source)
    # OUR CHOICE (the paper does not state its aggregation): a constant normalizer, so every term of
    # the loss is weighted alike and the gradient is grad J / max_new_tokens (`kljax kl-configs`).
    c.rl.loss_aggregation = "seq-mean-token-sum-norm"
    c.rl.prompts_per_step = 64          # guess: 320 sequences, so micro-batches split over 8-32 devices
    c.rl.max_prompt_len = 512           # guess
    c.rl.max_new_tokens = 1024          # guess
    c.rl.temperature = 1.0              # guess (secondary source)
    c.rl.top_p = 1.0                    # guess (secondary source)
    c.rl.micro_batches = 10             # guess: memory; 32 sequences per micro-batch
    c.optim.learning_rate = 1e-6        # guess
    c.optim.warmup_steps = 10           # guess
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    return c
