"""Default gradient-bias study (`kljax bias-study`): every preset KL configuration on a tabular
autoregressive policy with vocabulary 4 and responses of 6 tokens (4096 sequences), exact and Monte
Carlo, on-policy and with a sampler 4 optimizer steps stale. About a minute on 2 CPU cores.

Override any field on the command line, e.g. `--config.vocab=3 --config.configs=k1-reward,k3-loss`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # The toy policy: 'tabular' (one logit row per prefix) or 'transformer' (tiny causal transformer).
    c.policy = "tabular"
    c.vocab = 4
    c.length = 6
    c.seed = 0
    # Which KL configurations: 'presets' (the table of `kljax kl-configs`), 'grid' (every valid
    # combination), 'paper' (k1/k3 x reward/loss + both), or names: 'k1-reward,k3-loss'.
    c.configs = "presets"
    # 'exact' (enumerate every sequence), 'montecarlo' (sample batches), or 'both'.
    c.mode = "both"
    c.samples = 16  # B: sequences per gradient estimate (the batch); variance is per batch of B
    c.repeats = 512  # Monte-Carlo batches per estimate
    c.beta = 0.1  # KL coefficient of the toy RL run (and of the total-gradient columns)
    # The toy RL setting: theta_0 = ref + drift * random, then train_steps exact-gradient steps of
    # the toy reward + beta * KL objective; the sampler "stale by N" is theta from N steps earlier.
    c.drift = 0.3
    c.train_steps = 16
    c.learning_rate = 0.05
    c.optimizer = "adam"
    c.staleness = 4  # the table's off-policy columns: sampler this many optimizer steps stale
    # Sweeps (figures).
    c.lengths = (1, 2, 3, 4, 5, 6)
    c.sample_counts = (4, 16, 64)
    c.staleness_steps = (0, 1, 2, 4, 8)
    c.alphas = (0.0, 0.1, 0.2, 0.4, 0.8)  # sampler logits = theta + alpha * (random - theta)
    c.betas = (0.01, 0.03, 0.1, 0.3, 1.0)
    c.truncations = (1.5, 2.0, 5.0, 10.0)  # truncated sequence importance weights min(W, C)
    # Resources.
    c.chunk_size = 4096  # enumerated sequences per compiled call (exact mode)
    c.mc_chunk_size = 4096  # sampled sequences per compiled call (Monte-Carlo mode)
    c.memory_budget_gb = 4.0
    c.plots = True
    # Tiny transformer sizes (policy='transformer').
    c.transformer = ml_collections.ConfigDict(dict(d_model=16, n_heads=2, n_layers=2, logit_scale=1.5))
    return c
