"""The peer trainers' defaults table: for each peer, the fields that decide its KL gradient, their
defaults and where each default was read (file and version or commit); `settings_with_defaults`
checks a user's settings against it. A default not read at a named version has `confirmed=False`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kljax.errors import UserError

_TRL = "trl 1.16.0 (installed)"
_VERL_CFG = "verl-project/verl verl/trainer/config/_generated_ppo_trainer.yaml @1a7e2cab"
_VERL_ALGOS = "verl-project/verl verl/trainer/ppo/core_algos.py @018f23b5"
_ORLHF = "OpenRLHF/OpenRLHF openrlhf/cli/train_ppo_ray.py @021d1b09"
_TUNIX_GRPO = "google/tunix tunix/rl/grpo/grpo_learner.py @1f75a1e5"
_TUNIX_PPO = "google/tunix tunix/rl/ppo/ppo_learner.py @8a7c535d"


@dataclasses.dataclass(frozen=True)
class PeerField:
    """One setting of a peer trainer: its default, the values kljax can map (None: any value of
    `kind`), and where the default was read. confirmed=False: not read at a named version."""

    name: str
    default: Any
    kind: type | tuple[type, ...]
    source: str
    choices: tuple[Any, ...] | None = None
    confirmed: bool = True
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Peer:
    """A peer trainer's KL-relevant settings: `trainer`, the config class or section, the version
    read (`version`), and its fields."""

    name: str
    trainer: str
    section: str
    version: str
    fields: tuple[PeerField, ...]

    def field(self, name: str) -> PeerField:
        return next(f for f in self.fields if f.name == name)


_F = PeerField
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_INT = (int, type(None))
_TRL_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
_VERL_KL = ("kl", "k1", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "mse+", "k2+", "low_var_kl+", "k3+")
_VERL_AGG = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_ORLHF_ADV = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo")
_TUNIX_KL = ("kl", "mse_kl", "low_var_kl")
_TUNIX_AGG = ("token-mean", "sequence-mean-token-mean", "seq-mean-token-sum", "sequence-mean-token-sum-norm")
VERL_ACTOR = "actor_rollout_ref.actor."  # verl's actor config prefix
_A = VERL_ACTOR

PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer("trl-grpo", "TRL", "GRPOConfig", _TRL, (
            _F("beta", 0.0, _NUM, "trl/trainer/grpo_config.py"),
            _F("loss_type", "dapo", str, "trl/trainer/grpo_config.py", _TRL_LOSSES),
            _F("use_bias_correction_kl", True, bool, "trl/trainer/grpo_config.py"),
            _F("scale_rewards", "group", (str, bool), "trl/trainer/grpo_config.py",
               ("group", "batch", "none", True, False)),
            _F("importance_sampling_level", "token", str, "trl/trainer/grpo_config.py", ("token", "sequence")),
            _F("num_iterations", 1, int, "trl/trainer/grpo_config.py"),
            _F("epsilon", 0.2, _NUM, "trl/trainer/grpo_config.py"),
            _F("epsilon_high", None, _OPT_NUM, "trl/trainer/grpo_config.py"),
            _F("max_completion_length", 512, int, "trl/trainer/grpo_config.py"),
            _F("num_generations", 8, int, "trl/trainer/grpo_config.py"),
        )),
        Peer("trl-rloo", "TRL", "RLOOConfig", _TRL, (
            _F("beta", 0.05, _NUM, "trl/trainer/rloo_config.py"),
            _F("normalize_advantages", False, bool, "trl/trainer/rloo_config.py"),
            _F("num_iterations", 1, int, "trl/trainer/rloo_config.py"),
            _F("epsilon", 0.2, _NUM, "trl/trainer/rloo_config.py"),
            _F("epsilon_high", None, _OPT_NUM, "trl/trainer/rloo_config.py"),
            _F("max_completion_length", 512, int, "trl/trainer/rloo_config.py"),
            _F("num_generations", 2, int, "trl/trainer/rloo_config.py"),
        )),
        Peer("verl", "verl", "ppo_trainer.yaml (algorithm.*, actor_rollout_ref.*, data.*)",
             f"{_VERL_CFG}; loss code {_VERL_ALGOS}", (
            _F("algorithm.adv_estimator", "gae", str, _VERL_CFG, ("gae", "grpo", "grpo_vectorized", "rloo",
                                                                   "rloo_vectorized")),
            _F("algorithm.norm_adv_by_std_in_grpo", True, bool, _VERL_CFG),
            _F("algorithm.use_kl_in_reward", False, bool, _VERL_CFG),
            _F("algorithm.kl_penalty", "kl", str, _VERL_CFG, _VERL_KL),
            _F("algorithm.kl_ctrl.type", "fixed", str, _VERL_CFG, ("fixed", "adaptive")),
            _F("algorithm.kl_ctrl.kl_coef", 0.001, _NUM, _VERL_CFG),
            _F("algorithm.kl_ctrl.target_kl", 0.1, _NUM, _VERL_CFG),
            _F("algorithm.kl_ctrl.horizon", 10000, _NUM, _VERL_CFG),
            _F(_A + "use_kl_loss", False, bool, _VERL_CFG),
            _F(_A + "kl_loss_type", "low_var_kl", str, _VERL_CFG, _VERL_KL),
            _F(_A + "kl_loss_coef", 0.001, _NUM, _VERL_CFG),
            _F(_A + "loss_agg_mode", "token-mean", str, _VERL_CFG, _VERL_AGG),
            _F(_A + "clip_ratio_low", 0.2, _NUM, _VERL_CFG),
            _F(_A + "clip_ratio_high", 0.2, _NUM, _VERL_CFG),
            _F(_A + "ppo_epochs", 1, int, _VERL_CFG),
            _F(_A + "ppo_mini_batch_size", 256, int, _VERL_CFG),
            _F("data.train_batch_size", 1024, int, _VERL_CFG),
            _F("data.max_response_length", 512, int, _VERL_CFG),
            _F("actor_rollout_ref.rollout.n", 1, int, _VERL_CFG),
        )),
        Peer("openrlhf", "OpenRLHF", "train_ppo_ray.py arguments", _ORLHF, (
            _F("kl_estimator", "k1", str, _ORLHF, ("k1", "k2", "k3")),
            _F("use_kl_loss", False, bool, _ORLHF),
            _F("init_kl_coef", 0.01, _NUM, _ORLHF),
            _F("kl_target", None, _OPT_NUM, _ORLHF),
            _F("kl_horizon", 10000, _NUM, _ORLHF),
            _F("advantage_estimator", "gae", str, _ORLHF, _ORLHF_ADV),
            _F("no_advantage_std_norm", False, bool, _ORLHF),
            _F("eps_clip", 0.2, _NUM, _ORLHF),
            _F("eps_clip_low_high", None, (list, tuple, type(None)), _ORLHF),
            _F("n_samples_per_prompt", 1, int, _ORLHF),
            _F("generate_max_len", 1024, int, _ORLHF),
            _F("max_epochs", 1, int, _ORLHF),
            _F("rollout_batch_size", 1024, int, _ORLHF),
            _F("train_batch_size", 128, int, _ORLHF),
            _F("token_level_loss", True, bool, "openrlhf/models/loss.py PolicyLoss", confirmed=False,
               note="PolicyLoss(token_level_loss=True) read in stored copies of OpenRLHF's loss.py not tied "
                    "to a named commit; whether the trainer passes its default is not confirmed"),
        )),
        Peer("tunix-grpo", "Tunix", "GRPOConfig", _TUNIX_GRPO, (
            _F("beta", 0.04, _NUM, _TUNIX_GRPO),
            _F("kl_loss_mode", "kl", str, "tunix GRPOConfig (later versions)", _TUNIX_KL, confirmed=False,
               note="kl_loss_mode='kl' is the default in stored copies of later Tunix GRPOConfigs not tied to "
                    "a named commit; at @1f75a1e5 there is no kl_loss_mode and the loss calls "
                    "common.compute_kl_divergence with its default method 'low_var_kl' (k3; common.py @1e84391f)"),
            _F("loss_agg_mode", "sequence-mean-token-mean", str, _TUNIX_GRPO, _TUNIX_AGG),
            _F("advantage_estimator", "grpo", str, _TUNIX_GRPO, ("grpo",)),
            _F("num_generations", 2, int, _TUNIX_GRPO),
            _F("num_iterations", 1, int, _TUNIX_GRPO),
            _F("epsilon", 0.2, _NUM, _TUNIX_GRPO),
            _F("epsilon_high", None, _OPT_NUM, _TUNIX_GRPO),
            _F("max_tokens_to_generate", None, _OPT_INT, "tunix rollout config", confirmed=False,
               note="a rollout-config field set per run; its default was not read"),
        )),
        Peer("tunix-ppo", "Tunix", "PpoConfig", _TUNIX_PPO, (
            _F("beta", 0.04, _NUM, _TUNIX_PPO),
            _F("kl_method", "low_var_kl", str, _TUNIX_PPO, _TUNIX_KL,
               note="at @8a7c535d the reward calls common.compute_kl_divergence with its default 'low_var_kl'; "
                    "later PpoConfigs name it kl_method='low_var_kl'"),
            _F("epsilon", 0.2, _NUM, _TUNIX_PPO),
            _F("epsilon_high", None, _OPT_NUM, _TUNIX_PPO),
            _F("num_ppo_epochs", 1, int, _TUNIX_PPO),
            _F("gamma", 1.0, _NUM, _TUNIX_PPO),
            _F("gae_lambda", 0.95, _NUM, _TUNIX_PPO),
        )),
    )
}


def settings_with_defaults(peer: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The peer's defaults updated with `settings`; UserError for an unknown peer, an unknown key
    (naming it and the valid keys) or a value of the wrong type or outside the mapped choices."""
    if peer not in PEERS:
        raise UserError(f"unknown peer {peer!r}; choose one of {sorted(PEERS)}")
    spec = PEERS[peer]
    names = [f.name for f in spec.fields]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise UserError(f"{peer}: unknown setting(s) {unknown}; valid settings: {names}")
    values = {f.name: f.default for f in spec.fields}
    for key, value in settings.items():
        field = spec.field(key)
        kinds = field.kind if isinstance(field.kind, tuple) else (field.kind,)
        if not value_has_type(value, kinds):
            names_ = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise UserError(f"{peer}: {key}={value!r} must be {names_}")
        if field.choices is not None and value not in field.choices:
            raise UserError(f"{peer}: {key}={value!r} is not valid; choose one of {list(field.choices)}")
        low = 1 if float not in kinds else 0
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value >= low:
            raise UserError(f"{peer}: {key}={value!r} must be >= {low}")
        values[key] = value
    return values


def value_has_type(value: Any, kinds: tuple[type, ...]) -> bool:
    """isinstance, but a bool is not an int and an int is a float."""
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)
