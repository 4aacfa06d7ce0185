"""The RL loop's settings (`config.rl`): sampling, group baseline, loss aggregation, clipping,
staleness, micro-batching; and the rule for the temperature of the policy a sampler trains."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from kljax.errors import UserError
from kljax.rl.advantages import METHODS, MIN_GROUP, SCALES
from kljax.rl.objective import DEFAULT_AGGREGATION, check_aggregation


def policy_temperature(temperature: float) -> float:
    """The temperature T of the policy a sampler at `temperature` draws from: pi = softmax(logits / T),
    the distribution before any top-k/top-p/min-p truncation (as TRL and verl); pi_ref likewise.
    Greedy decoding (temperature 0) reports temperature-1 log-probs: T = 1 there."""
    return temperature if temperature > 0 else 1.0


def check_stop_values(stop: Any, name: str = "rl.stop") -> tuple[str | int, ...]:
    """`stop` as a tuple of non-empty strings and token ids >= 0 (a single string or id is one stop)."""
    if isinstance(stop, (str, int)) and not isinstance(stop, bool):
        stop = (stop,)
    try:
        values = tuple(stop or ())
    except TypeError:
        raise UserError(f"{name}={stop!r} must be a list of strings or token ids") from None
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise UserError(f"{name}: {v!r} is neither a string nor a token id")
        if isinstance(v, str) and not v:
            raise UserError(f"{name}: an empty string cannot be a stop")
        if isinstance(v, int) and v < 0:
            raise UserError(f"{name}: token id {v} must be >= 0")
    return values


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Sampling and policy-loss settings of the RL loop.

    The batch is prompts_per_step x group_size sequences of at most max_prompt_len + max_new_tokens
    tokens; min_p keeps tokens with p >= min_p * p_max (after temperature, top-k, top-p); stop holds
    strings or token ids that end a response like EOS. reuse_sampler_logprobs: when the sampler is
    the policy (`kljax.train.rollout.sampler_is_policy`), take log pi of the sampled tokens from it instead of a
    second forward pass (float32 only). clip_ratio_c: dual-clip PPO bound (> 1) or None.
    advantage_std_eps: grpo divides by the group std + this; advantage_scale: that std is the
    group's ("group") or the whole batch's ("batch", TRL's scale_rewards="batch"). sampler_chunk:
    prompts the sampler generates at once (bounds its KV cache; 0: all of them).
    repetition_penalty: the sampler divides a positive logit (multiplies a negative one) of every
    token already in the prompt or response by it, before the temperature (transformers'; 1: off).
    mask_truncated: responses that end without a stop (cut at max_new_tokens) leave the loss
    (their rewards still enter the group's baseline), as TRL's mask_truncated_completions.
    """

    advantage: str = "rloo"
    group_size: int = 4
    prompts_per_step: int = 4
    max_prompt_len: int = 64
    max_new_tokens: int = 32
    temperature: float = 0.8
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str | int, ...] = ()
    loss_aggregation: str = DEFAULT_AGGREGATION
    clip_low: float | None = 0.2
    clip_high: float | None = None
    updates_per_batch: int = 1
    async_level: int = 0
    micro_batches: int = 1
    reuse_sampler_logprobs: bool = True
    clip_ratio_c: float | None = None
    advantage_std_eps: float = 1e-4
    sampler_chunk: int = 0
    advantage_scale: str = "group"
    repetition_penalty: float = 1.0
    mask_truncated: bool = False

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def policy_temperature(self) -> float:
        """T of the policy trained, pi = softmax(logits / T) (`policy_temperature`)."""
        return policy_temperature(self.temperature)

    def __post_init__(self) -> None:
        if self.advantage not in METHODS:
            raise UserError(f"rl.advantage={self.advantage!r} is not valid; choose one of {list(METHODS)}")
        if self.group_size < MIN_GROUP[self.advantage]:
            raise UserError(f"rl.group_size={self.group_size}: advantage {self.advantage!r} needs group_size >= "
                            f"{MIN_GROUP[self.advantage]} (a baseline from the other samples of the prompt)")
        check_aggregation(self.loss_aggregation)
        for name in ("prompts_per_step", "max_prompt_len", "max_new_tokens", "updates_per_batch", "micro_batches"):
            if getattr(self, name) < 1:
                raise UserError(f"rl.{name}={getattr(self, name)} must be >= 1")
        if self.async_level < 0:
            raise UserError(f"rl.async_level={self.async_level} must be >= 0")
        if self.batch_size % self.micro_batches:
            raise UserError(f"rl.micro_batches={self.micro_batches} must divide the batch of prompts_per_step * "
                            f"group_size = {self.batch_size} sequences")
        if not self.temperature >= 0:
            raise UserError(f"rl.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"rl.top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise UserError(f"rl.top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0 <= self.min_p <= 1:
            raise UserError(f"rl.min_p={self.min_p} must be in [0, 1] (0 = off)")
        object.__setattr__(self, "stop", check_stop_values(self.stop))
        if self.clip_low is not None and not 0 <= self.clip_low < 1:
            raise UserError(f"rl.clip_low={self.clip_low!r} must be in [0, 1) (or None)")
        if self.clip_high is not None and not self.clip_high >= 0:
            raise UserError(f"rl.clip_high={self.clip_high!r} must be >= 0 (or None)")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise UserError(f"rl.clip_ratio_c={self.clip_ratio_c} must be > 1 (or None: no dual clip)")
        if not self.advantage_std_eps >= 0:
            raise UserError(f"rl.advantage_std_eps={self.advantage_std_eps} must be >= 0")
        if self.advantage_scale not in SCALES:
            raise UserError(f"rl.advantage_scale={self.advantage_scale!r} is not valid; choose one of {list(SCALES)}")
        if self.advantage_scale != "group" and self.advantage != "grpo":
            raise UserError(f"rl.advantage_scale={self.advantage_scale!r} picks grpo's std; rl.advantage="
                            f"{self.advantage!r} divides by none (set rl.advantage=grpo)")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise UserError(f"rl.repetition_penalty={self.repetition_penalty} must be > 0 (1: off)")
        if self.sampler_chunk < 0 or (0 < self.sampler_chunk < self.prompts_per_step
                                      and self.prompts_per_step % self.sampler_chunk):
            raise UserError(f"rl.sampler_chunk={self.sampler_chunk} must divide rl.prompts_per_step="
                            f"{self.prompts_per_step} (0: all prompts at once)")


def check_rl_against_model(rl: RLConfig, max_positions: int, num_shards: int) -> None:
    """Checks that need the model and mesh: the context length and the batch's split over the
    `num_shards` data-parallel shards (mesh data * fsdp)."""
    total = rl.max_prompt_len + rl.max_new_tokens
    if total > max_positions:
        raise UserError(f"rl.max_prompt_len + rl.max_new_tokens = {total} exceeds the model's context of "
                        f"{max_positions} tokens")
    if rl.prompts_per_step % num_shards:
        raise UserError(f"rl.prompts_per_step={rl.prompts_per_step} must split over the {num_shards} data-parallel "
                        "shards (mesh data * fsdp) the sampler shards prompts over")
    chunk = rl.sampler_chunk if 0 < rl.sampler_chunk < rl.prompts_per_step else rl.prompts_per_step
    if chunk % num_shards:
        raise UserError(f"rl.sampler_chunk={rl.sampler_chunk} prompts must split over the {num_shards} data-parallel "
                        "shards (mesh data * fsdp)")
    per_micro = rl.batch_size // rl.micro_batches
    if per_micro % num_shards:
        raise UserError(f"each micro-batch of {per_micro} sequences must split over the {num_shards} data-parallel "
                        "shards (mesh data * fsdp); change rl.prompts_per_step, rl.group_size or rl.micro_batches")
