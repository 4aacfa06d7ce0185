"""The run config: one frozen, typed `RunConfig` whose defaults are the default run, built once at
the edge from a dict, a YAML/JSON/.py file or CLI overrides (`load_run_config`)."""

from kljax.config.load import load_run_config, with_fields, with_overrides
from kljax.config.rl import RLConfig
from kljax.config.run import RunConfig
from kljax.config.sections import LoraConfig, OptimConfig

__all__ = ["LoraConfig", "OptimConfig", "RLConfig", "RunConfig", "load_run_config", "with_fields", "with_overrides"]
