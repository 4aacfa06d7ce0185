"""Gradient-bias study on the tiny causal transformer policy (about 4k parameters): vocabulary 3,
responses of 5 tokens (243 sequences, enumerated exactly). Same measurements as bias_default.py;
the classification of each configuration must not depend on how the policy is parameterized.

Run: kljax bias-study --config configs/bias_transformer.py --out runs/bias-transformer
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
    c.policy = "transformer"
    c.vocab = 3
    c.length = 5
    c.lengths = (1, 2, 3, 4, 5)
    # Adam moves every one of the transformer's parameters at once: a smaller step than the tabular one.
    c.learning_rate = 0.003
    c.drift = 0.1
    c.chunk_size = 256
    c.repeats = 128
    c.sample_counts = (4, 16)
    return c
