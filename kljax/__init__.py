"""kljax: KL-regularized RL fine-tuning of LLMs in JAX, and exact studies of KL-estimator gradients.

    import kljax
    result = kljax.RLTrainer(model="tiny", reward_funcs=[fn], train_dataset=data).train()   # kljax.api
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["RLTrainer", "TrainResult"]


def __getattr__(name: str) -> Any:
    """`kljax.RLTrainer` and `kljax.TrainResult`, imported on first use (`import kljax` stays light)."""
    if name in __all__:
        from kljax import api

        return getattr(api, name)
    raise AttributeError(f"module 'kljax' has no attribute {name!r}")
