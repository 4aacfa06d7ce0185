"""Run configuration: ml_collections files (`configs/NAME.py` with `get_config()`), command-line
overrides (`--config.kl.beta=0.1`), and one validation that turns a ConfigDict into typed settings,
raising ValueErrors that name the field and the valid choices before anything is compiled.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path
from typing import Any

import ml_collections

from kljax.rl.advantages import METHODS, MIN_GROUP
from kljax.rl.kl import KLConfig
from kljax.rl.objective import DEFAULT_AGGREGATION, check_aggregation
from kljax.sampling.logits import policy_temperature
from kljax.train.state import OptimConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.py"
MODEL_SOURCES = ("tiny", "default", "tabular")  # or a path to a Hugging Face checkpoint directory
PROMPT_FORMATS = ("auto", "chat", "plain", "raw")  # see kljax.tasks.prompting


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Sampling and policy-loss settings of the RL loop.

    reuse_sampler_logprobs: when the sampler draws from the policy itself (see
    `kljax.train.rollout.sampler_is_policy`), take the policy's log-probs of the sampled tokens (and
    the entropy metric) from the sampler instead of re-scoring the batch with another policy forward
    pass (float32 compute only: in 16-bit the two differ by rounding, and the batch is re-scored);
    False always re-scores.
    """

    advantage: str = "rloo"
    group_size: int = 4
    prompts_per_step: int = 8
    max_prompt_len: int = 64
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0  # keep tokens with p >= min_p * p_max (after temperature, top-k, top-p); 0: off
    stop: tuple[str | int, ...] = ()  # strings or token ids that end a response like EOS (`kljax.sampling.stops`)
    loss_aggregation: str = DEFAULT_AGGREGATION
    clip_low: float | None = 0.2
    clip_high: float | None = None
    updates_per_batch: int = 1
    async_level: int = 0
    micro_batches: int = 1
    reuse_sampler_logprobs: bool = True
    clip_ratio_c: float | None = None  # dual-clip PPO (verl's actor.clip_ratio_c); None: off
    advantage_std_eps: float = 1e-4  # grpo divides by the group std + this (TRL 1e-4, verl 1e-6)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def policy_temperature(self) -> float:
        """The temperature of the policy trained: pi = softmax(logits / T), pi_ref likewise, the
        distribution the sampler draws from before any top-k/top-p truncation (as TRL and verl).
        Greedy decoding (temperature 0) reports temperature-1 log-probs: T = 1 there."""
        return policy_temperature(self.temperature)

    def __post_init__(self) -> None:
        if self.advantage not in METHODS:
            raise ValueError(f"rl.advantage={self.advantage!r} is not valid; choose one of {list(METHODS)}")
        if self.group_size < MIN_GROUP[self.advantage]:
            raise ValueError(
                f"rl.group_size={self.group_size}: advantage {self.advantage!r} needs group_size >= "
                f"{MIN_GROUP[self.advantage]} (a baseline from the other samples of the prompt)"
            )
        check_aggregation(self.loss_aggregation)
        for name in ("prompts_per_step", "max_prompt_len", "max_new_tokens", "updates_per_batch", "micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name}={getattr(self, name)} must be >= 1")
        if self.async_level < 0:
            raise ValueError(f"rl.async_level={self.async_level} must be >= 0")
        if self.batch_size % self.micro_batches:
            raise ValueError(
                f"rl.micro_batches={self.micro_batches} must divide the batch of prompts_per_step * group_size = "
                f"{self.batch_size} sequences"
            )
        if not self.temperature >= 0:
            raise ValueError(f"rl.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rl.top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"rl.top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"rl.min_p={self.min_p} must be in [0, 1] (0 = off)")
        from kljax.sampling.stops import check_stop_values

        object.__setattr__(self, "stop", check_stop_values(self.stop))
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ValueError(f"rl.clip_ratio_c={self.clip_ratio_c} must be > 1 (or None: no dual clip)")
        if not self.advantage_std_eps >= 0:
            raise ValueError(f"rl.advantage_std_eps={self.advantage_std_eps} must be >= 0")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything a run needs, validated."""

    raw: ml_collections.ConfigDict
    kl: KLConfig
    rl: RLConfig
    optim: OptimConfig
    steps: int
    seed: int
    checkpoint_every: int
    keep_checkpoints: int
    max_nonfinite_steps: int
    mesh: tuple[int, int, int]


def load_config(path: str | os.PathLike | None = None) -> ml_collections.ConfigDict:
    """The run config of a file (default: configs/default.py): `get_config()` of a Python file, or
    a YAML/JSON file's fields over configs/kljax_base.py's defaults (`kljax.train.config_files`)."""
    from kljax.train.config_checks import default_config
    from kljax.train.config_files import get_config_of

    # configs import kljax_base.py beside them
    return get_config_of(Path(path) if path else DEFAULT_CONFIG, defaults=default_config)


def _parse_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string, e.g. --config.kl.estimator=k3


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str]) -> ml_collections.ConfigDict:
    """Apply `--config.a.b=value` (or `config.a.b=value`) strings; unknown fields are an error."""
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f"the config is a {type(config).__name__}, not a run config (a ConfigDict from "
                         "get_config(); a sweep config goes to `kljax sweep`)")
    config = ml_collections.ConfigDict(config.to_dict())
    for item in overrides:
        key, sep, value = item.lstrip("-").partition("=")
        if not sep or not key.startswith("config."):
            raise ValueError(f"override {item!r} must look like --config.field=value")
        path = key[len("config.") :].split(".")
        node = config
        for i, part in enumerate(path[:-1]):
            if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
                raise ValueError(f"unknown config field {'.'.join(path[: i + 1])!r} in override {item!r}")
            node = node[part]
        leaf = path[-1]
        if leaf not in node:
            raise ValueError(f"unknown config field {'.'.join(path)!r}; valid here: {sorted(node.keys())}")
        new = _parse_value(value)
        old = node[leaf]
        if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
            new = float(new)
        if old is not None and new is not None and type(old) is not type(new):
            raise ValueError(f"config.{'.'.join(path)}={value!r}: expected a {type(old).__name__}")
        with config.unlocked():
            node[leaf] = new
    return config


def _section(config: ml_collections.ConfigDict, name: str, cls: type) -> Any:
    values = dict(config.get(name, {}))
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} in config.{name}; valid: {sorted(names)}")
    return cls(**values)


def validate(config: ml_collections.ConfigDict) -> RunSettings:
    """Check every field; raise ValueError naming the bad one. Model-dependent checks (context
    length, vocabulary) happen in `check_against_model` once the model config is known."""
    from kljax.train.config_checks import check_ranges, check_types

    check_types(config)
    check_ranges(config)
    from kljax.train.reward_set import check_reward_config

    check_reward_config(config.get("reward", {}))  # reward.weights/timeout_s/on_error, with or without functions
    kl = KLConfig.from_mapping(dict(config.kl))
    rl = _section(config, "rl", RLConfig)
    for name in ("steps", "checkpoint_every", "keep_checkpoints", "max_nonfinite_steps"):  # before optim's
        if int(config[name]) < 1:  # total_steps, which defaults to steps
            raise ValueError(f"config.{name}={config[name]} must be >= 1")
    optim_values = dict(config.optim)
    optim_values.setdefault("total_steps", int(config.steps))
    optim = OptimConfig(**optim_values)
    source = config.model.source
    if source not in MODEL_SOURCES and not Path(source).is_dir():
        raise ValueError(
            f"config.model.source={source!r} is neither one of {list(MODEL_SOURCES)} nor a checkpoint directory"
        )
    from kljax.models.lora import from_section as lora_from_section

    if lora_from_section(config.model) is not None and source == "tabular":
        raise ValueError("config.model.lora.rank > 0 needs a transformer: model.source='tabular' has no projections")
    if config.task.prompt_format not in PROMPT_FORMATS:
        raise ValueError(
            f"config.task.prompt_format={config.task.prompt_format!r} is not valid; "
            f"choose one of {list(PROMPT_FORMATS)}"
        )
    from kljax.tasks.prompting import ANSWER_FORMATS

    answer_format = config.task.get("answer_format", "")
    if answer_format and answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"config.task.answer_format={answer_format!r} is not valid; choose one of {sorted(ANSWER_FORMATS)} "
            "or '' for the task's default"
        )
    mesh = (int(config.mesh.data), int(config.mesh.fsdp), int(config.mesh.tensor))
    return RunSettings(config, kl, rl, optim, int(config.steps), int(config.seed), int(config.checkpoint_every),
                       int(config.keep_checkpoints), int(config.max_nonfinite_steps), mesh)


def check_against_model(settings: RunSettings, max_positions: int, num_shards: int) -> None:
    """Model- and mesh-dependent checks: context length and batch divisibility."""
    rl = settings.rl
    total = rl.max_prompt_len + rl.max_new_tokens
    if total > max_positions:
        raise ValueError(
            f"rl.max_prompt_len + rl.max_new_tokens = {total} exceeds the model's context of {max_positions} tokens"
        )
    if rl.prompts_per_step % num_shards:
        raise ValueError(
            f"rl.prompts_per_step={rl.prompts_per_step} must split over the {num_shards} data-parallel shards "
            "(mesh data * fsdp) the sampler shards prompts over"
        )
    per_micro = rl.batch_size // rl.micro_batches
    if per_micro % num_shards:
        raise ValueError(
            f"each micro-batch of {per_micro} sequences must split over the {num_shards} data-parallel shards "
            "(mesh data * fsdp); change rl.prompts_per_step, rl.group_size or rl.micro_batches"
        )
