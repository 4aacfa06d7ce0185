"""The peer trainers' defaults table: for each peer, the fields that decide its KL gradient, their
defaults and where each default was read (file and version or commit); `settings_with_defaults`
checks a user's settings against it. A default not read at a named version has `confirmed=False`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kljax.errors import UserError

# Where each default was read. The stored copies the search index holds are named by repository
# and commit; whether a commit is on the peer's main branch, and its date, could not be confirmed
# from them (docs/audit.md says what was and was not verified).
_TRL = "trl 1.16.0 (installed)"
_VERL_CFG = "verl-project/verl verl/trainer/config/_generated_ppo_trainer.yaml @1a7e2cab"
_VERL_ALGOS = "verl-project/verl verl/trainer/ppo/core_algos.py @018f23b5"
_ORLHF = "OpenRLHF/OpenRLHF main (dotted arguments, renamed 2026-04-19; read in stored copies, commit not confirmed)"
_ORLHF_EXP = "OpenRLHF/OpenRLHF openrlhf/trainer/ppo_utils/experience_maker.py (group_norm: std + 1e-9; KL after)"
_TUNIX_GRPO = ("google/tunix tunix/rl/algo_core.py @fba91f54 (loss and advantages run from a stored copy, "
               "docs/audit.md) and tunix/rl/grpo/grpo_learner.py @1f75a1e5 (read)")
_TUNIX_CORE = "google/tunix tunix/rl/algo_core/grpo_core.py @caed9733 (run from a stored copy)"
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
    aliases: tuple[tuple[str, str], ...] = ()  # (old name, current name): accepted, with a note

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
_TUNIX_AGG = ("token-mean", "sequence-mean-token-mean", "seq-mean-token-sum", "sequence-mean-token-sum-norm",
              "sequence-mean-token-scale")
# OpenRLHF's flat argument names before main renamed them to dotted ones (2026-04-19, per #38).
_ORLHF_ALIASES = (
    ("kl_estimator", "algo.kl.estimator"), ("use_kl_loss", "algo.kl.use_loss"), ("init_kl_coef", "algo.kl.init_coef"),
    ("kl_target", "algo.kl.target"), ("kl_horizon", "algo.kl.horizon"),
    ("advantage_estimator", "algo.advantage.estimator"), ("no_advantage_std_norm", "algo.advantage.no_std_norm"),
    ("eps_clip", "actor.eps_clip"), ("eps_clip_low_high", "actor.eps_clip_low_high"), ("dual_clip", "actor.dual_clip"),
    ("n_samples_per_prompt", "rollout.n_samples_per_prompt"), ("generate_max_len", "rollout.max_new_tokens"),
    ("max_epochs", "train.max_epochs"), ("rollout_batch_size", "rollout.batch_size"),
    ("train_batch_size", "train.batch_size"),
)
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
            _F(_A + "clip_ratio_c", 3.0, _NUM, _VERL_CFG,
               note="dual-clip lower bound of compute_policy_loss (default 3.0 in verl's actor config)"),
            _F(_A + "ppo_epochs", 1, int, _VERL_CFG),
            _F(_A + "ppo_mini_batch_size", 256, int, _VERL_CFG),
            _F("data.train_batch_size", 1024, int, _VERL_CFG),
            _F("data.max_response_length", 512, int, _VERL_CFG),
            _F("actor_rollout_ref.rollout.n", 1, int, _VERL_CFG),
        )),
        Peer("openrlhf", "OpenRLHF", "train_ppo_ray.py arguments (dotted)", f"{_ORLHF}; {_ORLHF_EXP}", (
            _F("algo.kl.estimator", "k1", str, _ORLHF, ("k1", "k2", "k3")),
            _F("algo.kl.use_loss", False, bool, _ORLHF),
            _F("algo.kl.init_coef", 0.01, _NUM, _ORLHF),
            _F("algo.kl.target", None, _OPT_NUM, _ORLHF),
            _F("algo.kl.horizon", 10000, _NUM, _ORLHF),
            _F("algo.advantage.estimator", "gae", str, _ORLHF, _ORLHF_ADV),
            _F("algo.advantage.no_std_norm", False, bool, _ORLHF,
               note="whitening of gae / reinforce / reinforce_baseline advantages only; group_norm ignores it"),
            _F("actor.eps_clip", 0.2, _NUM, _ORLHF),
            _F("actor.eps_clip_low_high", None, (list, tuple, type(None)), _ORLHF),
            _F("actor.dual_clip", None, _OPT_NUM, _ORLHF),
            _F("rollout.n_samples_per_prompt", 1, int, _ORLHF),
            _F("rollout.max_new_tokens", None, _OPT_INT, _ORLHF, confirmed=False,
               note="replaces generate_max_len (removed on main); its default (None: up to data.max_len) was read "
                    "in a stored copy not tied to a main commit"),
            _F("train.max_epochs", 1, int, _ORLHF),
            _F("rollout.batch_size", 1024, int, _ORLHF),
            _F("train.batch_size", 128, int, _ORLHF),
            _F("token_level_loss", True, bool, "openrlhf/models/loss.py PolicyLoss", confirmed=False,
               note="PolicyLoss(token_level_loss=True) read in stored copies of OpenRLHF's loss.py not tied "
                    "to a named commit; whether the trainer passes its default is not confirmed"),
        ), _ORLHF_ALIASES),
        Peer("tunix-grpo", "Tunix", "GRPOConfig", _TUNIX_GRPO, (
            _F("beta", 0.04, _NUM, _TUNIX_GRPO),
            _F("kl_loss_mode", "kl", str, "tunix GRPOConfig (later versions)", _TUNIX_KL, confirmed=False,
               note="kl_loss_mode='kl' is the default in stored copies of later Tunix GRPOConfigs not tied to "
                    "a named commit; at @1f75a1e5 there is no kl_loss_mode and the loss calls "
                    "common.compute_kl_divergence with its default method 'low_var_kl' (k3; common.py @1e84391f)"),
            _F("loss_agg_mode", "sequence-mean-token-mean", str, _TUNIX_GRPO, _TUNIX_AGG),
            _F("advantage_estimator", "grpo", str, _TUNIX_GRPO, ("grpo", "rloo", "drgrpo")),
            _F("num_generations", 2, int, _TUNIX_GRPO),
            _F("num_iterations", 1, int, _TUNIX_GRPO),
            _F("epsilon", 0.2, _NUM, _TUNIX_GRPO),
            _F("epsilon_high", None, _OPT_NUM, _TUNIX_CORE, confirmed=False,
               note="the upper clip (None: epsilon); a GRPOConfig field in some stored copies, not in others "
                    "(#38: not at main in August 2026)"),
            _F("epsilon_c", None, _OPT_NUM, _TUNIX_CORE, confirmed=False,
               note="dual-clip bound (None: none): grpo_core @caed9733 uses 3.0 when the config has no "
                    "epsilon_c, algo_core @fba91f54 has no dual clip; later GRPOConfig copies default it to None"),
            _F("max_tokens_to_generate", 64, int, "tunix RolloutConfig", confirmed=False,
               note="64 in the stored copies of Tunix's rollout config read (#38); not tied to a main commit"),
        )),
        Peer("tunix-ppo", "Tunix", "PpoConfig", _TUNIX_PPO, (
            _F("beta", 0.04, _NUM, _TUNIX_PPO),
            _F("kl_method", "low_var_kl", str, _TUNIX_PPO, _TUNIX_KL,
               note="at @8a7c535d the reward calls common.compute_kl_divergence with its default 'low_var_kl'; "
                    "later PpoConfigs name it kl_method='low_var_kl'"),
            _F("epsilon", 0.2, _NUM, _TUNIX_PPO),
            _F("epsilon_high", None, _OPT_NUM, _TUNIX_PPO),
            _F("num_iterations", 1, int, _TUNIX_PPO, note="named num_ppo_epochs at @8a7c535d"),
            _F("gamma", 1.0, _NUM, _TUNIX_PPO),
            _F("gae_lambda", 0.95, _NUM, _TUNIX_PPO),
        ), (("num_ppo_epochs", "num_iterations"),)),
    )
}


def canonical(peer: str, settings: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`settings` with the peer's old names replaced by current ones, and a note for each rename;
    UserError for an unknown peer or an old and a new name given together."""
    if peer not in PEERS:
        raise UserError(f"unknown peer {peer!r}; choose one of {sorted(PEERS)}")
    renames = dict(PEERS[peer].aliases)
    out: dict[str, Any] = {}
    notes = []
    for key, value in settings.items():
        name = renames.get(key, key)
        if name != key:
            if name in settings:
                raise UserError(f"{peer}: {key} and {name} name the same setting ({key} is its old name); give one")
            notes.append(f"{key} is the old name of {name} (accepted as an alias)")
        out[name] = value
    return out, tuple(notes)


def settings_with_defaults(peer: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The peer's defaults updated with `settings` (old names accepted, `canonical`); UserError for
    an unknown peer, an unknown key (naming it and the valid keys) or a value of the wrong type or
    outside the mapped choices."""
    settings, given = canonical(peer, settings)[0], settings
    renamed = {dict(PEERS[peer].aliases).get(k, k): k for k in given}  # current name -> the name given
    spec = PEERS[peer]
    names = [f.name for f in spec.fields]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise UserError(f"{peer}: unknown setting(s) {unknown}; valid settings: {names}")
    values = {f.name: f.default for f in spec.fields}
    for name, value in settings.items():
        field = spec.field(name)
        key = renamed.get(name, name)  # as the user wrote it (an old name too)
        kinds = field.kind if isinstance(field.kind, tuple) else (field.kind,)
        if not value_has_type(value, kinds):
            names_ = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise UserError(f"{peer}: {key}={value!r} must be {names_}")
        if field.choices is not None and value not in field.choices:
            raise UserError(f"{peer}: {key}={value!r} is not valid; choose one of {list(field.choices)}")
        low = 1 if float not in kinds else 0
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value >= low:
            raise UserError(f"{peer}: {key}={value!r} must be >= {low}")
        values[name] = value
    return values


def value_has_type(value: Any, kinds: tuple[type, ...]) -> bool:
    """isinstance, but a bool is not an int and an int is a float."""
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)
