"""The paper's off-policy study: Qwen3-4B-Instruct-2507 on Countdown, asynchronous sampling 10 steps
stale, Dr. GRPO. The paper: KL regularization stabilizes training where no KL collapses.

Paper: off-policy (async), 10 steps stale, Dr. GRPO, Countdown, Qwen3-4B-Instruct-2507.
GUESSES (secondary sources): batch 512, 16 samples per prompt, beta 0.005. GUESSES (ours): the rest.
"""

from kljax_base import base


def get_config():
    c = base()
    c.steps = 250                       # GUESS
    c.checkpoint_every = 25
    c.eval_examples = 512
    c.model.source = "/path/to/Qwen3-4B-Instruct-2507"  # set on the command line
    c.model.dtype = "bfloat16"          # GUESS
    c.model.remat = "full"              # GUESS
    c.task.name = "countdown"
    c.task.eval_splits = "test,ood_numbers"
    c.task.prompt_format = "chat"
    c.kl.estimator = "k3"               # with the token-ratio correction (DeepSeek-V3.2 eq. 7); compare k1/reward
    c.kl.placement = "loss"
    c.kl.off_policy = "token_ratio"
    c.kl.beta = 0.005                   # GUESS (secondary source)
    c.rl.advantage = "dr_grpo"
    # Dr. GRPO's constant normalizer (OUR CHOICE: the paper names Dr. GRPO, not its aggregation). With a
    # stale sampler no setting is unbiased for grad J (`kljax kl-configs --async-level 10`).
    c.rl.loss_aggregation = "seq-mean-token-sum-norm"
    c.rl.group_size = 16                # GUESS (secondary source)
    c.rl.prompts_per_step = 32          # GUESS: 512 sequences (secondary source)
    c.rl.async_level = 10               # the paper: 10 steps stale
    c.rl.max_prompt_len = 256           # GUESS
    c.rl.max_new_tokens = 1024          # GUESS
    c.rl.micro_batches = 32             # GUESS: memory
    c.optim.learning_rate = 1e-6        # GUESS
    return c
