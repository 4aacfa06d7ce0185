"""The default run (`kljax train` with no --config): SmolLM2-135M-Instruct (embedded, no download) on
generated arithmetic, k1 in the reward with RLOO, the paper's recommended configuration.

Its values are the defaults of `kljax.config.RunConfig` (kljax/config/run.py and the sections it
holds), so every other config is this run with some fields changed. In-domain: 2-digit addition and
subtraction (`arithmetic:train`, evaluated on `test`); out-of-domain: more digits (`ood_digits`) and
other operations (`ood_ops`).
"""


def get_config():
    return {}
