"""Other trainers' KL settings as kljax objectives. The table of peer defaults is
`kljax.verdicts.peers.PEERS`; `translate(peer, settings)` fills the
peer's defaults in for missing keys and returns the equivalent `RunObjective` plus notes for
whatever kljax maps only approximately. `users(config)` names the peer settings that give a KL
configuration (the "who uses it" labels of `kljax kl-configs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from kljax.errors import UserError
from kljax.rl.kl import KLConfig
from kljax.verdicts.objective import RunObjective
from kljax.verdicts.peers import VERL_ACTOR as _A
from kljax.verdicts.peers import canonical, settings_with_defaults, value_has_type


@dataclasses.dataclass(frozen=True)
class Translation:
    """A peer's settings as a kljax objective. exact: the peer's gradient and kljax's agree (to
    float rounding, or a stated constant) on every input; otherwise `approximations` names each
    difference and its size measured on the reference input of docs/audit.md. notes: facts that do
    not change the gradient (or whose default was not confirmed)."""

    run: RunObjective
    approximations: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def exact(self) -> bool:
        return not self.approximations


class _Notes(list):
    """The translators' notes; `approx` records a difference from the peer's gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.approximations: list[str] = []

    def approx(self, text: str) -> None:
        self.approximations.append(text)


def translation(peer: str, settings: Mapping[str, Any]) -> Translation:
    """`peer` run with `settings` (defaults filled in) as a kljax objective (see `Translation`).
    UserError for bad input or a setting with no kljax counterpart at all."""
    values = settings_with_defaults(peer, settings)
    notes = _Notes()
    notes.extend(canonical(peer, settings)[1])
    objective = _TRANSLATORS[peer](values, notes)
    return Translation(objective, tuple(notes.approximations), tuple(notes))


def translate(peer: str, settings: Mapping[str, Any]) -> tuple[RunObjective, tuple[str, ...]]:
    """(the kljax objective, every note: the approximations first) of `translation`."""
    t = translation(peer, settings)
    return t.run, t.approximations + t.notes


def _clip(low: float, high: float | None) -> tuple[float, float | None]:
    return float(low), (None if high is None or high == low else float(high))


def _dual_clip(peer: str, key: str, value: float, notes: _Notes) -> float:
    """rl.clip_ratio_c for the peer's dual-clip bound `key` (> 1, else a UserError naming it), noted."""
    clip_c = float(value)
    if not clip_c > 1:
        raise UserError(f"{peer}: {key}={clip_c!r} must be > 1 ({peer}'s dual-clip bound)")
    notes.append(f"dual-clip PPO at {key}={clip_c:g} (rl.clip_ratio_c): no gradient from a token with a negative "
                 "advantage whose ratio exceeds it; inactive on-policy")
    return clip_c


# grpo's (r - mean) / (std + eps), ddof=1 in each: TRL 1e-4; verl 1e-6 (core_algos); OpenRLHF 1e-9
# (experience_maker, group_norm); Tunix 1e-6 (algo_core compute_advantages; 1e-4 in grpo_learner @1f75a1e5).
TRL_STD_EPS, VERL_STD_EPS, OPENRLHF_STD_EPS, TUNIX_STD_EPS = 1e-4, 1e-6, 1e-9, 1e-6


def _trl_grpo(v: dict[str, Any], notes: _Notes) -> RunObjective:
    sequence_is = v["importance_sampling_level"] == "sequence"
    if v["beta"] == 0:
        kl = KLConfig(placement="none", beta=0.0)
    else:
        off = "token_ratio" if v["use_bias_correction_kl"] else "none"
        kl = KLConfig("k3", "loss", off_policy=off, beta=float(v["beta"]))
    loss = v["loss_type"]
    aggregation = {"grpo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm",
                   "luspo": "seq-mean-token-sum"}.get(loss, "token-mean")
    if loss == "bnpo":
        notes.append("loss_type='bnpo' divides by the tokens of each process's batch: token-mean on one process "
                     "(several processes weigh each process's tokens alike, which kljax's global mean does not)")
    stale = v["num_iterations"] > 1
    if loss == "cispo":
        notes.approx("loss_type='cispo' weighs each token's score by its ratio clamped at epsilon_high (detached), "
                     "not PPO's clipped ratio: the gradient differs even on-policy (docs/audit.md: cosine 0.985-1.000 "
                     "on-policy, 0.80-0.84 stale on the reference input)")
    elif loss in ("sapo", "vespo"):
        text = (f"loss_type={loss!r} replaces PPO's clipped ratio by its own surrogate, whose gradient at ratio 1 is "
                "PPO's: the same on-policy")
        if stale:
            notes.approx(text + f"; num_iterations > 1 makes later updates stale, where they differ (docs/audit.md: "
                         f"cosine {'0.44-0.62' if loss == 'sapo' else '0.80-0.86'} on the stale reference input)")
        else:
            notes.append(text + " (num_iterations=1: every update is)")
    if sequence_is:
        text = ("importance_sampling_level='sequence' (GSPO) gives every token the sequence's mean log-ratio; "
                "kljax's ratios are per token: the same policy-gradient term on-policy")
        weighted_kl = v["beta"] != 0 and v["use_bias_correction_kl"]
        if weighted_kl:
            text += ("; use_bias_correction_kl weighs the KL by that sequence ratio, whose gradient spreads over the "
                     "sequence's tokens (docs/audit.md: relative difference 1e-3-6e-3 on-policy)")
        if stale:
            notes.approx(text + "; the stale updates of num_iterations > 1 differ (docs/audit.md: cosine 0.87-0.92 "
                         "on the stale reference input)")
        elif weighted_kl:
            notes.approx(text)
        else:
            notes.append(text + " (num_iterations=1: every update is)")
    scale = {True: "group", False: "none"}.get(v["scale_rewards"], v["scale_rewards"])
    advantage = "dr_grpo" if scale == "none" else "grpo"
    low, high = _clip(v["epsilon"], v["epsilon_high"])
    return RunObjective(kl, aggregation, advantage, v["num_generations"], low, high, v["num_iterations"],
                        max_new_tokens=v["max_completion_length"], std_eps=TRL_STD_EPS,
                        advantage_scale="batch" if scale == "batch" else "group")


def _trl_rloo(v: dict[str, Any], notes: _Notes) -> RunObjective:
    kl = KLConfig(placement="none", beta=0.0) if v["beta"] == 0 else KLConfig("k1", "reward", beta=float(v["beta"]))
    advantage = "rloo"
    if v["normalize_advantages"]:
        advantage = "grpo"
        notes.approx("normalize_advantages=True whitens the RLOO advantages over the whole batch; kljax's nearest is "
                     "grpo's group std (sample-dependent either way: biased; docs/audit.md: cosine 0.75)")
    if v["num_iterations"] > 1:
        notes.approx("TRL RLOO clips one sequence-level ratio exp(sum_t log-ratio) and averages over sequences; "
                     "kljax clips per token: the same gradient on the first update (on-policy), different on the "
                     "stale ones (num_iterations > 1; docs/audit.md: cosine 0.88 on the stale reference input)")
    else:
        notes.append("TRL RLOO clips one sequence-level ratio; with num_iterations=1 every update is on-policy, "
                     "where that is seq-mean-token-sum's gradient")
    low, high = _clip(v["epsilon"], v["epsilon_high"])
    return RunObjective(kl, "seq-mean-token-sum", advantage, v["num_generations"], low, high, v["num_iterations"],
                        max_new_tokens=v["max_completion_length"], std_eps=TRL_STD_EPS)


def _verl_estimator(name: str, key: str, placement: str, notes: _Notes) -> str:
    base = name.rstrip("+")
    est = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}[base]
    if est == "k3" and (not name.endswith("+") or placement == "reward"):
        # verl's kl_penalty_forward clamps k3's value; "+" keeps that clamped value (in the reward, all
        # that enters) and takes k2's unclamped gradient (in the loss: exact)
        notes.approx(f"{key}={name!r}: verl clamps k3 to [-10, 10] (and the log-ratio to [-20, 20] in recent "
                     "versions); kljax does not clamp: the gradients differ only on tokens where |k3| > 10 (a "
                     "log-ratio below about -2.6 nats), none on the reference input of docs/audit.md")
    if name.endswith("+") and est == "k3":
        return "k3+"
    if name.endswith("+") and est == "k1":
        if placement == "loss":
            notes.append(f"{key}={name!r}: straight-through k1 value with k2's gradient; in the loss only the "
                         "gradient matters, mapped to k2")
            return "k2"
        return "k1"  # in the reward only the (detached) value enters
    return est


def _verl(v: dict[str, Any], notes: _Notes) -> RunObjective:
    in_reward, in_loss = v["algorithm.use_kl_in_reward"], v[_A + "use_kl_loss"]
    adv_name = v["algorithm.adv_estimator"].replace("_vectorized", "")
    reward_est = (_verl_estimator(v["algorithm.kl_penalty"], "algorithm.kl_penalty", "reward", notes)
                  if in_reward else "")
    loss_est = _verl_estimator(v[_A + "kl_loss_type"], _A + "kl_loss_type", "loss", notes) if in_loss else ""
    beta_r, beta_l = float(v["algorithm.kl_ctrl.kl_coef"]), float(v[_A + "kl_loss_coef"])
    adaptive = v["algorithm.kl_ctrl.type"] == "adaptive"
    target = float(v["algorithm.kl_ctrl.target_kl"]) if adaptive and in_reward else None
    credit = "reward_to_go" if adv_name == "gae" and in_reward else "sequence"
    if in_reward and in_loss:
        if reward_est != loss_est or beta_r != beta_l:
            raise UserError(
                f"verl: k={v['algorithm.kl_penalty']!r} (kl_coef={beta_r}) in the reward and "
                f"k={v[_A + 'kl_loss_type']!r} (kl_loss_coef={beta_l}) in the loss: kljax's placement 'both' uses "
                "one estimator and one beta; set algorithm.kl_penalty and actor_rollout_ref.actor.kl_loss_type to "
                "the same estimator and the two coefficients equal")
        kl = KLConfig(loss_est, "both", credit, beta=beta_l, target_kl=target,
                      adapt_horizon=float(v["algorithm.kl_ctrl.horizon"]))
    elif in_reward:
        kl = KLConfig(reward_est, "reward", credit, beta=beta_r, target_kl=target,
                      adapt_horizon=float(v["algorithm.kl_ctrl.horizon"]))
    elif in_loss:
        kl = KLConfig(loss_est, "loss", beta=beta_l)
    else:
        kl = KLConfig(placement="none", beta=0.0)
    if adaptive and not in_reward:
        notes.append("algorithm.kl_ctrl.type='adaptive' adapts only the in-reward coefficient; no KL in reward here")
    if adv_name == "gae":
        advantage = "rloo"
        notes.approx("algorithm.adv_estimator='gae' trains a critic, which kljax does not have; the verdict is for "
                     "kljax's critic-free rloo" + (" (per-token KL credited reward-to-go, as GAE with gamma = lam "
                                                   "= 1 does)" if in_reward else "") + ": a different estimator "
                     "of the same policy gradient, not comparable on one input")
    elif adv_name == "grpo":
        advantage = "grpo" if v["algorithm.norm_adv_by_std_in_grpo"] else "dr_grpo"
    else:
        advantage = "rloo"
    agg = v[_A + "loss_agg_mode"]
    if agg == "token-sum":
        notes.append("loss_agg_mode='token-sum' is seq-mean-token-sum times the batch size: mapped to "
                     "seq-mean-token-sum (a constant scale)")
        agg = "seq-mean-token-sum"
    if agg == "seq-mean-token-sum-norm":
        notes.append("verl's seq-mean-token-sum-norm divides by the padded response length (loss_scale_factor); "
                     "mapped to kljax's max_new_tokens = data.max_response_length")
    per_batch = v["data.train_batch_size"] // max(1, v[_A + "ppo_mini_batch_size"])
    updates = v[_A + "ppo_epochs"] * max(1, per_batch)
    if per_batch > 1:
        notes.append(f"data.train_batch_size / ppo_mini_batch_size = {per_batch} optimizer steps per rollout batch: "
                     "every step after the first uses stale samples (rl.updates_per_batch)")
    group = v["actor_rollout_ref.rollout.n"]
    if advantage in ("rloo", "grpo") and group < 2:
        notes.append(f"actor_rollout_ref.rollout.n={group}: a group baseline needs >= 2 samples per prompt; "
                     "the verdict uses group_size 2")
        group = 2
    low, high = _clip(v[_A + "clip_ratio_low"], v[_A + "clip_ratio_high"])
    clip_c = _dual_clip("verl", _A + "clip_ratio_c", v[_A + "clip_ratio_c"], notes)
    return RunObjective(kl, agg, advantage, group, low, high, updates, max_new_tokens=v["data.max_response_length"],
                        clip_ratio_c=clip_c, std_eps=VERL_STD_EPS)


def _openrlhf(v: dict[str, Any], notes: _Notes) -> RunObjective:
    beta, est = float(v["algo.kl.init_coef"]), v["algo.kl.estimator"]
    adv_name = v["algo.advantage.estimator"]
    target = None if v["algo.kl.target"] is None else float(v["algo.kl.target"])
    if beta == 0:
        kl = KLConfig(placement="none", beta=0.0)
    elif v["algo.kl.use_loss"]:
        kl = KLConfig(est, "loss", beta=beta)
    else:
        # experience_maker: the group baseline and scale see the task reward; compute_reward then adds
        # -beta * k_t per token and the returns are cumulative (gamma 1): reward-to-go, outside the baseline.
        kl = KLConfig(est, "reward", "reward_to_go", beta=beta, target_kl=target,
                      adapt_horizon=float(v["algo.kl.horizon"]), in_baseline=adv_name == "gae")
        notes.append("the per-token KL is added after the group baseline and scale and credited reward-to-go "
                     "(kl.in_baseline=False, kl.credit='reward_to_go'), as OpenRLHF's compute_reward does")
    advantage = {"gae": "rloo", "reinforce": "rloo", "rloo": "rloo", "reinforce_baseline": "dr_grpo",
                 "group_norm": "grpo", "dr_grpo": "dr_grpo"}[adv_name]
    if adv_name == "group_norm" and v["algo.advantage.no_std_norm"]:
        notes.append("algo.advantage.no_std_norm whitens gae / reinforce / reinforce_baseline advantages; "
                     "group_norm divides by the group's std either way")
    if adv_name in ("gae", "reinforce"):
        notes.approx(f"algo.advantage.estimator={adv_name!r} has no kljax counterpart (a critic, or no baseline and "
                     "batch whitening); the verdict is for kljax's rloo: a different estimator, not comparable on "
                     "one input")
    if adv_name == "reinforce_baseline":
        notes.approx("reinforce_baseline subtracts the group mean (kljax's dr_grpo), then whitens the advantages "
                     "over the whole batch, which kljax does not (sample-dependent scaling: biased)")
    notes.append("OpenRLHF clamps the shaped reward to reward.clip_range (-10, 10) by default: the same as kljax "
                 "while the normalized rewards stay inside it")
    aggregation = "token-mean" if v["token_level_loss"] else "seq-mean-token-mean"
    notes.append(f"loss aggregation {aggregation} follows PolicyLoss(token_level_loss={v['token_level_loss']}); "
                 "not confirmed at a main commit")
    per_batch = v["rollout.batch_size"] * v["rollout.n_samples_per_prompt"] // max(1, v["train.batch_size"])
    updates = v["train.max_epochs"] * max(1, per_batch)
    if per_batch > 1:
        notes.append(f"rollout.batch_size * rollout.n_samples_per_prompt / train.batch_size = {per_batch} optimizer "
                     "steps per rollout (train.batch_size counted in samples: assumed): every step after the first "
                     "uses stale samples")
    group = v["rollout.n_samples_per_prompt"]
    if advantage != "dr_grpo" and group < 2:
        notes.append(f"rollout.n_samples_per_prompt={group}: a group baseline needs >= 2; the verdict uses "
                     "group_size 2")
        group = 2
    low, high = v["actor.eps_clip"], None
    if v["actor.eps_clip_low_high"] is not None:
        pair = list(v["actor.eps_clip_low_high"])
        if len(pair) != 2 or not all(value_has_type(x, (float,)) and x >= 0 for x in pair):
            raise UserError(f"openrlhf: actor.eps_clip_low_high={pair!r} must be two numbers >= 0 (low, high)")
        low, high = pair
    low, high = _clip(low, high)
    clip_c = v["actor.dual_clip"]
    if clip_c is not None and not clip_c > 1:
        raise UserError(f"openrlhf: actor.dual_clip={clip_c!r} must be > 1 (or null)")
    return RunObjective(kl, aggregation, advantage, group, low, high, updates,
                        max_new_tokens=v["rollout.max_new_tokens"],
                        clip_ratio_c=None if clip_c is None else float(clip_c), std_eps=OPENRLHF_STD_EPS)


_TUNIX_EST = {"kl": "k1", "mse_kl": "k2", "low_var_kl": "k3"}


def _tunix_grpo(v: dict[str, Any], notes: _Notes) -> RunObjective:
    beta = float(v["beta"])
    kl = (KLConfig(placement="none", beta=0.0) if beta == 0
          else KLConfig(_TUNIX_EST[v["kl_loss_mode"]], "loss", beta=beta))
    # Tunix's loss_agg_mode (tunix/rl/common.aggregate_loss): "sequence-mean-token-sum-norm" divides the
    # token sum by `norm`, which defaults to the number of rows and the GRPO loss never passes: kljax's
    # seq-mean-token-sum. "sequence-mean-token-scale" divides each row's sum by the response width: kljax's
    # seq-mean-token-sum-norm with max_new_tokens = max_tokens_to_generate.
    names = {"sequence-mean-token-mean": "seq-mean-token-mean", "sequence-mean-token-sum-norm": "seq-mean-token-sum",
             "sequence-mean-token-scale": "seq-mean-token-sum-norm"}
    aggregation = names.get(v["loss_agg_mode"], v["loss_agg_mode"])
    if v["loss_agg_mode"] == "sequence-mean-token-sum-norm":
        notes.append("Tunix's sequence-mean-token-sum-norm divides by its norm, the batch size by default (the GRPO "
                     "loss passes none): kljax's seq-mean-token-sum, not kljax's seq-mean-token-sum-norm")
    if v["loss_agg_mode"] == "sequence-mean-token-scale":
        notes.append("sequence-mean-token-scale divides each row's token sum by the response width "
                     "(max_tokens_to_generate) and averages over non-empty rows: kljax's seq-mean-token-sum-norm")
    advantage = {"grpo": "grpo", "rloo": "rloo", "drgrpo": "dr_grpo"}[v["advantage_estimator"]]
    notes.append("Tunix before kl_loss_mode (grpo_learner @1f75a1e5) divided by the group std + 1e-4 (this "
                 "mapping: + 1e-6, algo_core's) and always took low_var_kl (k3) in the loss: for that version pass "
                 "kl_loss_mode=low_var_kl; its grpo advantages differ on near-equal groups")
    low, high = _clip(v["epsilon"], v["epsilon_high"])
    clip_c = None if v["epsilon_c"] is None else _dual_clip("tunix-grpo", "epsilon_c", v["epsilon_c"], notes)
    return RunObjective(kl, aggregation, advantage, v["num_generations"], low, high, v["num_iterations"],
                        max_new_tokens=v["max_tokens_to_generate"], std_eps=TUNIX_STD_EPS, clip_ratio_c=clip_c)


def _tunix_ppo(v: dict[str, Any], notes: _Notes) -> RunObjective:
    beta = float(v["beta"])
    kl = (KLConfig(placement="none", beta=0.0) if beta == 0
          else KLConfig(_TUNIX_EST[v["kl_method"]], "reward", "reward_to_go", beta=beta))
    notes.approx(f"Tunix PPO trains a critic with GAE (gamma={v['gamma']}, gae_lambda={v['gae_lambda']}), which "
                 "kljax does not have; the verdict is for kljax's critic-free rloo, the per-token KL credited "
                 "reward-to-go")
    notes.approx("the PPO policy loss's aggregation was not read; the verdict uses token-mean (not confirmed)")
    low, high = _clip(v["epsilon"], v["epsilon_high"])
    return RunObjective(kl, "token-mean", "rloo", 2, low, high, v["num_iterations"])


_TRANSLATORS: dict[str, Callable[[dict[str, Any], _Notes], RunObjective]] = {
    "trl-grpo": _trl_grpo, "trl-rloo": _trl_rloo, "verl": _verl, "openrlhf": _openrlhf,
    "tunix-grpo": _tunix_grpo, "tunix-ppo": _tunix_ppo,
}


def overrides(run: RunObjective) -> list[str]:
    """`--config.kl.*` / `--config.rl.*` flags that give a kljax run this objective."""
    return [f"--config.{k}={v}" for k, v in objective_fields(run).items()]


def objective_fields(run: RunObjective) -> dict[str, Any]:
    """The dotted kl.* / rl.* run config fields that give a kljax run this objective."""
    kl = run.kl
    flags = {f"kl.{k}": getattr(kl, k) for k in ("estimator", "placement", "credit", "scope", "off_policy", "beta")}
    if kl.target_kl is not None:
        flags.update({"kl.target_kl": kl.target_kl, "kl.adapt_horizon": kl.adapt_horizon})
    if not kl.in_baseline:
        flags["kl.in_baseline"] = False
    flags.update({"rl.loss_aggregation": run.aggregation, "rl.advantage": run.advantage,
                  "rl.group_size": run.group_size, "rl.clip_low": run.clip_low, "rl.clip_high": run.clip_high,
                  "rl.updates_per_batch": run.updates_per_batch})
    if run.clip_ratio_c is not None:
        flags["rl.clip_ratio_c"] = run.clip_ratio_c
    if run.advantage == "grpo":
        flags["rl.advantage_std_eps"] = run.std_eps
        if run.advantage_scale != "group":
            flags["rl.advantage_scale"] = run.advantage_scale
    if run.max_new_tokens is not None:
        flags["rl.max_new_tokens"] = run.max_new_tokens
    return flags


# Named peer settings behind the "who uses it" labels of `kljax kl-configs`.
USAGES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("TRL GRPO default (beta=0)", "trl-grpo", {}),
    ("verl default (use_kl_in_reward and use_kl_loss false)", "verl", {}),
    ("TRL GRPO with beta > 0 (use_bias_correction_kl default)", "trl-grpo", {"beta": 0.04}),
    ("TRL GRPO with beta > 0, use_bias_correction_kl=false", "trl-grpo",
     {"beta": 0.04, "use_bias_correction_kl": False}),
    ("TRL RLOO default", "trl-rloo", {}),
    ("verl use_kl_loss with kl_loss_type=low_var_kl", "verl", {_A + "use_kl_loss": True}),
    ("verl kl_loss_type=mse", "verl", {_A + "use_kl_loss": True, _A + "kl_loss_type": "mse"}),
    ("verl kl_loss_type=k3+", "verl", {_A + "use_kl_loss": True, _A + "kl_loss_type": "k3+"}),
    ("verl use_kl_in_reward with kl_penalty=kl (adv_estimator=grpo)", "verl",
     {"algorithm.use_kl_in_reward": True, "algorithm.adv_estimator": "grpo"}),
    ("verl use_kl_in_reward with kl_penalty=kl (adv_estimator=gae)", "verl", {"algorithm.use_kl_in_reward": True}),
    ("OpenRLHF default (GAE)", "openrlhf", {}),
    ("OpenRLHF algo.advantage.estimator=rloo", "openrlhf",
     {"algo.advantage.estimator": "rloo", "rollout.n_samples_per_prompt": 4}),
    ("OpenRLHF algo.kl.use_loss with algo.kl.estimator=k3", "openrlhf",
     {"algo.kl.use_loss": True, "algo.kl.estimator": "k3"}),
    ("OpenRLHF algo.kl.use_loss with algo.kl.estimator=k2", "openrlhf",
     {"algo.kl.use_loss": True, "algo.kl.estimator": "k2"}),
    ("Tunix GRPO default (kl_loss_mode=kl)", "tunix-grpo", {}),
    ("Tunix GRPO kl_loss_mode=low_var_kl", "tunix-grpo", {"kl_loss_mode": "low_var_kl"}),
    ("Tunix PPO default (k3 in reward, GAE)", "tunix-ppo", {}),
)


def _key(c: KLConfig, credit: bool = True) -> tuple:
    return (c.estimator, c.placement, c.scope, c.off_policy, c.truncation) + ((c.credit,) if credit else ())


def users(config: KLConfig, presets: tuple[KLConfig, ...] = ()) -> list[str]:
    """Labels of the `USAGES` whose translated KL configuration is `config` (same estimator,
    placement, scope, off-policy correction and credit). A usage whose credit matches no config
    in `presets` is attached to the one that differs only in credit (same expected gradient)."""
    keys = {_key(p) for p in presets}
    found = []
    for label, peer, settings in USAGES:
        kl = translate(peer, settings)[0].kl
        exact = _key(kl) == _key(config)
        loose = _key(kl) not in keys and _key(kl, False) == _key(config, False)
        if exact or loose:
            found.append(label)
    return found


def with_users(config: KLConfig, note: str, presets: tuple[KLConfig, ...] = ()) -> str:
    """`note`, followed by "; used by: ..." when peers' settings give `config` (see `users`)."""
    found = users(config, presets)
    return f"{note}; used by: {', '.join(found)}" if found else note
