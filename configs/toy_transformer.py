"""The exact-optimum toy task (configs/toy_tabular.py) on a tiny random transformer over its 3 ids.

The transformer of `kljax converge-study --policy transformer`: 2 layers, hidden 32, 4 heads,
initialised with std 0.3 (so pi_ref is not near-uniform), AdamW at peak learning rate 0.01 (at the
tabular 0.1 one step overshoots). The same exact metrics in every row. The mesh is toy_tabular's
(tensor takes every device): it fits 1, 2 or 4 devices; elsewhere pick one that divides the 4 heads
and rl.prompts_per_step, e.g. 8 devices: --config.mesh.data=4 --config.mesh.tensor=2
--config.rl.prompts_per_step=12.
"""

from toy_tabular import get_config as toy_tabular


def get_config():
    return {
        **toy_tabular(),
        "model.source": "tiny",
        "model.tiny": {"vocab_size": 3, "init_std": 0.3},  # vocab = task.toy.vocab: the token ids are the responses
        "optim": {"learning_rate": 0.01, "schedule": "cosine", "end_lr_fraction": 0.05},
    }
