"""A seconds-long gradient-bias study for tests and smoke runs: vocabulary 3, length 3 (27 sequences).

Run: kljax bias-study --config configs/bias_tiny.py --out runs/bias-tiny
"""

import importlib.util
import pathlib

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    path = pathlib.Path(__file__).with_name("bias_default.py")
    spec = importlib.util.spec_from_file_location("bias_default", path)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    c = base.get_config()
    c.vocab = 3
    c.length = 3
    c.lengths = (1, 2, 3)
    c.samples = 8
    c.repeats = 64
    c.sample_counts = (4, 8)
    c.train_steps = 6
    c.learning_rate = 0.2
    c.staleness = 4
    c.staleness_steps = (0, 2, 4)
    c.alphas = (0.0, 0.5)
    c.betas = (0.1, 1.0)
    c.truncations = (1.5,)
    c.chunk_size = 32
    c.mc_chunk_size = 512
    return c
