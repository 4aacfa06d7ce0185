"""The Python API: `kljax.RLTrainer`, TRL's way of training, with every argument checked at the edge."""

from kljax.api.rl_trainer import RLTrainer, TrainResult, reward_spec_of, run_config

__all__ = ["RLTrainer", "TrainResult", "reward_spec_of", "run_config"]
