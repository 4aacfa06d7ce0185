"""`kljax audit`: peer defaults translate to the kljax objective the peer's code computes, inputs
(key=value, JSON and YAML files) parse, bad input is one clear error, and the verdicts hold."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kljax.cli import main
from kljax.config import RunConfig, with_overrides
from kljax.errors import UserError
from kljax.verdicts import audit
from kljax.verdicts import peers as audit_peers
from kljax.verdicts.objective import describe_objective
from kljax.verdicts.presets import PRESETS

ROOT_CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# peer -> (estimator, placement, credit, off_policy, beta, aggregation, advantage, clip_low, clip_high,
#          updates_per_batch), from the defaults table and the peer code read (see kljax/rl/audit.py)
DEFAULTS = {
    "trl-grpo": ("k1", "none", "sequence", "none", 0.0, "token-mean", "grpo", 0.2, None, 1),
    "trl-rloo": ("k1", "reward", "sequence", "none", 0.05, "seq-mean-token-sum", "rloo", 0.2, None, 1),
    "verl": ("k1", "none", "sequence", "none", 0.0, "token-mean", "rloo", 0.2, None, 4),
    "openrlhf": ("k1", "reward", "reward_to_go", "none", 0.01, "token-mean", "rloo", 0.2, None, 8),
    "tunix-grpo": ("k1", "loss", "sequence", "none", 0.04, "seq-mean-token-mean", "grpo", 0.2, None, 1),
    "tunix-ppo": ("k3", "reward", "reward_to_go", "none", 0.04, "token-mean", "rloo", 0.2, None, 1),
}


def _summary(run):
    kl = run.kl
    return (kl.estimator, kl.placement, kl.credit, kl.off_policy, kl.beta, run.aggregation, run.advantage,
            run.clip_low, run.clip_high, run.updates_per_batch)


@pytest.mark.parametrize("peer", sorted(DEFAULTS))
def test_peer_defaults_translate(peer):
    run, _ = audit.translate(peer, {})
    assert _summary(run) == DEFAULTS[peer]


def test_table_has_every_peer_with_versions_and_the_issue_claims():
    assert set(audit_peers.PEERS) == set(DEFAULTS)
    for peer in audit_peers.PEERS.values():
        assert peer.version and peer.trainer and peer.section
        for f in peer.fields:
            assert f.source and (f.confirmed or f.note), f"{peer.name}.{f.name}: unconfirmed default needs a note"
    assert audit_peers.PEERS["trl-grpo"].field("beta").default == 0.0  # TRL GRPO: beta 0
    assert audit_peers.PEERS["trl-grpo"].version.startswith("trl 1.16.0")
    assert audit.translate("tunix-grpo", {})[0].kl.placement == "loss"  # Tunix GRPO: k1 in the loss
    ppo = audit.translate("tunix-ppo", {})[0].kl
    assert (ppo.estimator, ppo.placement) == ("k3", "reward")  # Tunix PPO: k3 in the reward
    orlhf = audit.translate("openrlhf", {})[0].kl
    assert (orlhf.estimator, orlhf.placement) == ("k1", "reward")  # OpenRLHF: k1 in the reward


@pytest.mark.parametrize(
    "peer, settings, expected",
    [
        ("trl-grpo", {"beta": 0.04}, ("k3", "loss", "token_ratio", "token-mean")),
        ("trl-grpo", {"beta": 0.04, "use_bias_correction_kl": False, "loss_type": "dr_grpo"},
         ("k3", "loss", "none", "seq-mean-token-sum-norm")),
        ("trl-grpo", {"beta": 0.04, "loss_type": "grpo"}, ("k3", "loss", "token_ratio", "seq-mean-token-mean")),
        ("verl", {"actor_rollout_ref.actor.use_kl_loss": True}, ("k3", "loss", "none", "token-mean")),
        ("verl", {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_type": "k3+"},
         ("k3+", "loss", "none", "token-mean")),
        ("verl", {"algorithm.use_kl_in_reward": True, "algorithm.adv_estimator": "grpo",
                  "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum"},
         ("k1", "reward", "none", "seq-mean-token-sum")),
        ("openrlhf", {"use_kl_loss": True, "kl_estimator": "k2"}, ("k2", "loss", "none", "token-mean")),
        ("tunix-grpo", {"kl_loss_mode": "low_var_kl"}, ("k3", "loss", "none", "seq-mean-token-mean")),
    ],
)
def test_settings_translate(peer, settings, expected):
    run, _ = audit.translate(peer, settings)
    assert (run.kl.estimator, run.kl.placement, run.kl.off_policy, run.aggregation) == expected


def test_advantages_and_staleness():
    run, notes = audit.translate("trl-grpo", {"scale_rewards": False, "num_iterations": 2, "num_generations": 4})
    assert (run.advantage, run.updates_per_batch, run.group_size) == ("dr_grpo", 2, 4)
    run, _ = audit.translate("verl", {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False,
                                      "actor_rollout_ref.actor.ppo_mini_batch_size": 1024,
                                      "actor_rollout_ref.rollout.n": 4})
    assert (run.advantage, run.updates_per_batch, run.group_size) == ("dr_grpo", 1, 4)
    _, notes = audit.translate("verl", {})
    assert any("critic" in n for n in notes) and any("stale" in n for n in notes)


def test_verl_mixed_placements_are_refused():
    with pytest.raises(ValueError, match="one estimator and one beta"):
        audit.translate("verl", {"algorithm.use_kl_in_reward": True, "actor_rollout_ref.actor.use_kl_loss": True})
    run, _ = audit.translate("verl", {"algorithm.use_kl_in_reward": True, "actor_rollout_ref.actor.use_kl_loss": True,
                                      "algorithm.kl_penalty": "low_var_kl"})
    assert (run.kl.estimator, run.kl.placement) == ("k3", "both")


def test_unbiased_peer_settings():
    run, _ = audit.translate("trl-rloo", {})  # k1 in reward, RLOO, token sum: the paper's recommendation
    assert describe_objective(run).verdict == "unbiased"


@pytest.mark.parametrize("peer", sorted(DEFAULTS))
def test_overrides_apply_to_the_base_config(peer):
    run, _ = audit.translate(peer, {})
    config = with_overrides(RunConfig(), audit.overrides(run))
    assert config.kl.estimator == run.kl.estimator and config.rl.loss_aggregation == run.aggregation
    assert config.kl.placement == run.kl.placement and config.rl.updates_per_batch == run.updates_per_batch


def test_cli_trl_grpo_beta_is_k3_in_loss_and_biased(capsys):
    assert main(["audit", "trl-grpo", "beta=0.04"]) == 0
    out = capsys.readouterr().out
    assert "--config.kl.estimator=k3" in out and "--config.kl.placement=loss" in out
    assert "--config.rl.loss_aggregation=token-mean" in out
    assert "verdict: biased" in out
    assert "  *  loss_type" in out and "     beta = 0.04" in out  # defaults marked, given value not


def test_cli_json_fields(capsys):
    assert main(["audit", "tunix-grpo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("peer", "trainer", "section", "version", "settings", "kljax", "overrides", "verdict", "scale",
                "gradient", "kl_gradient", "reasons", "notes"):
        assert key in report
    assert report["kljax"]["kl"]["estimator"] == "k1" and report["kljax"]["aggregation"] == "seq-mean-token-mean"
    mode = next(s for s in report["settings"] if s["name"] == "kl_loss_mode")
    assert mode["is_default"] and not mode["confirmed"] and mode["note"]


def test_cli_key_value_parsing(capsys):
    assert main(["audit", "verl", "actor_rollout_ref.actor.use_kl_loss=true",
                 "actor_rollout_ref.actor.kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type=mse",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kljax"]["kl"]["estimator"] == "k2" and report["kljax"]["kl"]["beta"] == 0.01


def test_cli_json_and_yaml_files(tmp_path, capsys):
    path = tmp_path / "grpo.json"
    path.write_text(json.dumps({"beta": 0.04, "loss_type": "grpo"}))
    assert main(["audit", "trl-grpo", "--file", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kljax"]["aggregation"] == "seq-mean-token-mean" and report["kljax"]["kl"]["beta"] == 0.04
    yaml_path = tmp_path / "verl.yaml"  # nested sections, as verl's yaml
    yaml_path.write_text("algorithm:\n  use_kl_in_reward: true\n  adv_estimator: grpo\n"
                         "actor_rollout_ref:\n  actor:\n    loss_agg_mode: seq-mean-token-sum\n")
    assert main(["audit", "verl", "algorithm.kl_ctrl.kl_coef=0.05", "--file", str(yaml_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    kl = report["kljax"]["kl"]
    assert (kl["estimator"], kl["placement"], kl["beta"]) == ("k1", "reward", 0.05)
    assert report["kljax"]["aggregation"] == "seq-mean-token-sum"


@pytest.mark.parametrize(
    "argv, names",
    [
        (["audit", "nope"], ["'nope'", "trl-grpo", "tunix-ppo"]),
        (["audit", "trl-grpo", "betta=0.1"], ["'betta'", "beta", "loss_type"]),
        (["audit", "trl-grpo", "loss_type=foo"], ["loss_type='foo'", "dapo", "dr_grpo"]),
        (["audit", "trl-grpo", "beta=high"], ["beta='high'", "must be"]),
        (["audit", "trl-grpo", "beta=-1"], ["beta=-1", ">= 0"]),
        (["audit", "openrlhf", "use_kl_loss=1"], ["use_kl_loss=1", "bool"]),
        (["audit", "trl-grpo", "beta"], ["'beta'", "key=value"]),
        (["audit", "trl-grpo", "--file", "missing.yaml"], ["missing.yaml"]),
    ],
)
def test_cli_bad_input_is_one_line_error(argv, names, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kljax audit: error:") and "\n" not in err
    for name in names:
        assert name in err


def test_cli_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("beta: [1\n")
    assert main(["audit", "trl-grpo", "--file", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    assert main(["audit", "trl-grpo", "--file", str(listing)]) == 2
    assert "mapping" in capsys.readouterr().err


def test_kl_configs_labels_come_from_the_peer_table():
    notes = {audit._key(c): note for c, note in PRESETS}
    presets = tuple(c for c, _ in PRESETS)
    for label, peer, settings in audit.USAGES:
        kl = audit.translate(peer, settings)[0].kl
        matches = [note for c, note in PRESETS if label in note]
        assert matches, f"{label!r} is in no kl-configs note"
        assert all(audit.users(c, presets) for c, note in PRESETS if label in note)
        assert audit._key(kl) not in notes or label in notes[audit._key(kl)]
    k1_loss = next(note for c, note in PRESETS if (c.estimator, c.placement) == ("k1", "loss"))
    assert "Tunix GRPO default" in k1_loss


def test_openrlhf_dotted_keys_old_names_and_kl_outside_the_baseline():
    """OpenRLHF main's dotted names (old ones accepted with a note); group_norm is grpo with std + 1e-9 and
    the per-token KL added after the baseline, credited reward-to-go; no_std_norm leaves group_norm alone."""
    t = audit.translation("openrlhf", {"algo.advantage.estimator": "group_norm", "algo.advantage.no_std_norm": True,
                                       "init_kl_coef": 0.05, "rollout.n_samples_per_prompt": 4})
    run = t.run
    assert (run.advantage, run.std_eps, run.group_size, run.kl.beta) == ("grpo", 1e-9, 4, 0.05)
    assert (run.kl.placement, run.kl.credit, run.kl.in_baseline) == ("reward", "reward_to_go", False)
    assert any("init_kl_coef is the old name of algo.kl.init_coef" in n for n in t.notes) and t.exact
    with pytest.raises(ValueError, match="name the same setting"):
        audit.translation("openrlhf", {"init_kl_coef": 0.1, "algo.kl.init_coef": 0.1})
    dr = audit.translation("openrlhf", {"algo.advantage.estimator": "dr_grpo", "rollout.n_samples_per_prompt": 4,
                                        "rollout.batch_size": 32, "actor.dual_clip": 3.0})
    assert dr.run.clip_ratio_c == 3.0 and dr.run.updates_per_batch == 1
    info = describe_objective(dr.run)  # task reward (G-1)/G, the KL outside the baseline 1: effective beta
    assert info.verdict == "biased" and "effective beta is 4/3" in info.gradient
    assert "--config.kl.in_baseline=False" in audit.overrides(dr.run)
    assert not audit.translation("openrlhf", {"algo.advantage.estimator": "reinforce_baseline"}).exact


def test_verl_dual_clip_and_std_epsilon():
    run = audit.translation("verl", {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4}).run
    assert (run.clip_ratio_c, run.std_eps) == (3.0, 1e-6)
    flags = audit.overrides(run)
    assert "--config.rl.clip_ratio_c=3.0" in flags and "--config.rl.advantage_std_eps=1e-06" in flags
    assert describe_objective(dataclasses.replace(run, updates_per_batch=1, aggregation="seq-mean-token-sum",
                                                  advantage="rloo")).verdict == "unbiased"  # inactive on-policy
    with pytest.raises(ValueError, match="clip_ratio_c"):
        audit.translation("verl", {"actor_rollout_ref.actor.clip_ratio_c": 1.0})


@pytest.mark.parametrize("mode, ours", [("sequence-mean-token-sum-norm", "seq-mean-token-sum"),
                                        ("sequence-mean-token-scale", "seq-mean-token-sum-norm"),
                                        ("sequence-mean-token-mean", "seq-mean-token-mean")])
def test_tunix_aggregations_and_advantages(mode, ours):
    run = audit.translation("tunix-grpo", {"loss_agg_mode": mode}).run
    assert run.aggregation == ours and run.max_new_tokens == 64 and run.std_eps == 1e-6
    for name, adv in (("rloo", "rloo"), ("drgrpo", "dr_grpo"), ("grpo", "grpo")):
        assert audit.translation("tunix-grpo", {"advantage_estimator": name}).run.advantage == adv
    ppo = audit.translation("tunix-ppo", {"num_ppo_epochs": 2})
    assert ppo.run.updates_per_batch == 2 and any("old name" in n for n in ppo.notes)


def test_equivalent_only_where_the_gradients_agree(capsys):
    assert main(["audit", "trl-grpo", "beta=0.04", "importance_sampling_level=sequence"]) == 0
    out = capsys.readouterr().out
    assert "approximately" in out and "equivalent" not in out and "importance_sampling_level='sequence'" in out
    assert main(["audit", "trl-grpo", "scale_rewards=batch"]) == 0
    out = capsys.readouterr().out
    assert "equivalent" in out and "--config.rl.advantage_scale=batch" in out
    assert main(["audit", "trl-rloo", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mapping"] == "exact" and report["approximations"] == []


@pytest.mark.parametrize("name", ["k3+", "low_var_kl+", "k3", "low_var_kl"])
def test_verl_clamps_k3s_value_so_only_the_straight_through_loss_is_exact(name):
    """verl's kl_penalty_forward clamps k3 to [-10, 10]; its "+" variants keep that clamped value and
    take k2's gradient. In the reward only the value enters (clamped: approximate); in the loss only
    the gradient (k2's, unclamped: exact for "+"). Measured against verl's own code: a clamped token
    moves the in-reward "+" gradient by 0.34 relative."""
    grpo = {"algorithm.adv_estimator": "grpo"}  # verl's default, gae, is approximate by itself
    reward = audit.translation("verl", grpo | {"algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": name})
    loss = audit.translation("verl", grpo | {"actor_rollout_ref.actor.use_kl_loss": True,
                                             "actor_rollout_ref.actor.kl_loss_type": name})
    assert not reward.exact and any("clamps k3" in a for a in reward.approximations)
    assert loss.exact == name.endswith("+")


def test_tunix_grpo_dual_clip_and_upper_clip_are_mapped():
    """Tunix's grpo_core applies a dual clip (epsilon_c) and an upper clip (epsilon_high) where its
    config has them: mapped like verl's, refused when the bound is not > 1; absent by default."""
    plain = audit.translation("tunix-grpo", {}).run
    assert plain.clip_ratio_c is None and plain.clip_high is None
    run = audit.translation("tunix-grpo", {"epsilon_c": 3.0, "epsilon_high": 0.28}).run
    assert run.clip_ratio_c == 3.0 and run.clip_high == 0.28 and run.clip_low == 0.2
    with pytest.raises(UserError, match="epsilon_c=0.5 must be > 1"):
        audit.translation("tunix-grpo", {"epsilon_c": 0.5})
