"""Loss aggregation and policy surrogates against direct numpy; group baselines; config validation."""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.cli import main as cli_main
from kljax.rl import advantages as adv
from kljax.rl import losses, objective
from kljax.rl.kl import KLBiasWarning, KLConfig, adapt_beta
from kljax.verdicts.kl import describe
from kljax.verdicts.objective import warn_if_biased

RNG = np.random.default_rng(0)
VALUES = RNG.normal(size=(4, 6)).astype(np.float32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.float32)


def numpy_aggregate(v, m, mode, max_len=None):
    if mode == "token-mean":
        return (v * m).sum() / m.sum()
    if mode == "seq-mean-token-mean":
        return np.mean([(v[i] * m[i]).sum() / max(m[i].sum(), 1) for i in range(len(v))])
    if mode == "seq-mean-token-sum":
        return (v * m).sum() / len(v)
    return (v * m).sum() / (max_len or v.shape[1]) / len(v)


def weighted_mean(v, m, mode):
    """sum_b w_b sum_t v m / D with the objective's w_b and D, written out."""
    return objective.sequence_weights(m, mode) @ (v * m).sum(1) / objective.denominator(m, mode)


@pytest.mark.parametrize("mode", objective.AGGREGATIONS)
def test_aggregation_against_numpy(mode):
    np.testing.assert_allclose(weighted_mean(VALUES, MASK, mode), numpy_aggregate(VALUES, MASK, mode), rtol=1e-5)


@pytest.mark.parametrize("mode", objective.AGGREGATIONS)
def test_aggregation_is_additive_over_micro_batches(mode):
    """Micro-batch sums over the whole batch's denominator add up to the full-batch loss (gradient
    accumulation): w_b depends on sequence b alone."""
    den = objective.denominator(MASK, mode)
    parts = [objective.sequence_weights(MASK[i : i + 2], mode) @ (VALUES[i : i + 2] * MASK[i : i + 2]).sum(1)
             for i in (0, 2)]
    np.testing.assert_allclose(sum(parts) / den, weighted_mean(VALUES, MASK, mode), rtol=1e-5)


def test_aggregation_unknown_mode():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        objective.denominator(MASK, "mean")


def test_policy_loss_clipping_against_numpy():
    logp = RNG.normal(size=(3, 4)).astype(np.float32) - 1
    old = logp + RNG.normal(size=(3, 4)).astype(np.float32) * 0.3
    a = RNG.normal(size=(3, 4)).astype(np.float32)
    m = np.ones((3, 4), np.float32)
    loss, clipped = losses.policy_loss(logp, old, a, m, clip_low=0.1, clip_high=0.3)
    r = np.exp(logp - old)
    expected = -np.minimum(r * a, np.clip(r, 0.9, 1.3) * a)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_array_equal(clipped, (np.clip(r, 0.9, 1.3) * a < r * a).astype(np.float32))
    # On-policy, unclipped: the gradient is -A grad log pi.
    g = jax.grad(lambda lp: jnp.sum(losses.policy_loss(lp, lp, a, m, clip_low=None)[0]))(jnp.asarray(logp))
    np.testing.assert_allclose(g, -a, rtol=1e-6)


def test_rloo_grpo_dr_grpo_against_numpy():
    r = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], np.float32)
    g = r.reshape(2, 4)
    loo = (g.sum(1, keepdims=True) - g) / 3
    np.testing.assert_allclose(adv.advantages(r, 4, "rloo"), (g - loo).reshape(-1), rtol=1e-6)
    grpo = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)  # TRL's eps
    np.testing.assert_allclose(adv.advantages(r, 4, "grpo"), grpo.reshape(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv.advantages(r, 4, "dr_grpo"), (g - g.mean(1, keepdims=True)).reshape(-1))
    # A group whose rewards are all equal gives zero advantage, never nan.
    for method in adv.METHODS:
        out = adv.advantages(r, 4, method)[4:]
        assert bool(jnp.all(out == 0)), method


def test_token_advantages_fold_the_penalty():
    task = jnp.asarray([1.0, 0.0, 1.0, 0.0])
    pen_b = jnp.asarray([0.5, 0.2, 0.1, 0.4])
    pen_bt = jnp.asarray([[0.5, 0.3], [0.2, 0.1], [0.1, 0.0], [0.4, 0.4]])
    a = adv.token_advantages(task, pen_bt, pen_b, beta=0.5, group_size=2, method="rloo")
    returns = task - 0.5 * pen_b
    base = jnp.asarray([returns[1], returns[0], returns[3], returns[2]])
    np.testing.assert_allclose(a, task[:, None] - 0.5 * pen_bt - base[:, None], rtol=1e-6)


def test_grpo_equal_group_is_zero_for_every_credit():
    """Two identical responses with a KL penalty credited reward-to-go: the group's returns are
    equal, so every token's advantage is 0 (it was beta x earlier KL / eps: [0, 14999.985, 4999.995])."""
    task = jnp.asarray([1.0, 1.0, 0.0, 1.0])
    pen_bt = jnp.asarray([[0.4, 0.1, 0.0], [0.4, 0.1, 0.0], [0.3, 0.2, 0.1], [0.2, 0.1, 0.0]])
    pen_b = pen_bt[:, 0]  # reward-to-go: the sequence total is the first token's
    for method in ("grpo",):
        a = adv.token_advantages(task, pen_bt, pen_b, beta=0.3, group_size=2, method=method)
        assert bool(jnp.all(a[:2] == 0)), a[:2]
        returns = task - 0.3 * pen_b
        std = jnp.std(returns[2:], ddof=1)
        np.testing.assert_allclose(a[2:], (task[2:, None] - 0.3 * pen_bt[2:] - returns[2:].mean()) / (std + 1e-4),
                                   rtol=1e-5)


def test_kl_outside_the_baseline_is_added_after_it():
    task = jnp.asarray([1.0, 0.0, 0.5, 0.5])
    pen_bt = jnp.asarray([[0.5, 0.3], [0.2, 0.1], [0.1, 0.0], [0.4, 0.4]])
    for method in adv.METHODS:
        a = adv.token_advantages(task, pen_bt, pen_bt[:, 0], 0.5, 2, method, kl_in_baseline=False)
        np.testing.assert_allclose(a, adv.advantages(task, 2, method)[:, None] - 0.5 * pen_bt, rtol=1e-6)
        assert bool(jnp.all(adv.advantages(task, 2, method)[2:] == 0))


def test_dual_clip_zeroes_the_gradient_of_a_large_ratio_with_negative_advantage():
    """verl's clip_ratio_c: ratio 4 > c = 3 and A < 0 gives gradient 0 (2 without it: -A x ratio)."""
    sampler = jnp.log(jnp.asarray([[0.1, 0.5, 0.1, 0.5]]))
    logp = sampler + jnp.log(jnp.asarray([[4.0, 1.0, 4.0, 1.1]]))
    a = jnp.asarray([[-0.5, -0.5, 0.5, 0.5]])
    m = jnp.ones_like(a)
    loss = lambda lp, c: jnp.sum(losses.policy_loss(lp, sampler, a, m, 0.2, None, c)[0])
    g = jax.grad(loss)(logp, 3.0)
    g_plain = jax.grad(loss)(logp, None)
    np.testing.assert_allclose(g[0], [0.0, 0.5, 0.0, -0.55], atol=1e-6)
    np.testing.assert_allclose(g_plain[0], [2.0, 0.5, 0.0, -0.55], atol=1e-6)  # ratio 4, A -0.5: -A ratio = 2
    assert float(losses.policy_loss(logp, sampler, a, m, 0.2, None, 3.0)[1][0, 0]) == 1.0  # counted as clipped
    with pytest.raises(ValueError, match="clip_ratio_c"):
        losses.policy_loss(logp, sampler, a, m, 0.2, None, 1.0)


def test_advantage_errors():
    with pytest.raises(ValueError, match="group_size >= 2"):
        adv.advantages(jnp.zeros(4), 1, "rloo")
    with pytest.raises(ValueError, match="whole number of groups"):
        adv.advantages(jnp.zeros(5), 2, "rloo")
    with pytest.raises(ValueError, match="rloo"):
        adv.advantages(jnp.zeros(4), 2, "ppo")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"estimator": "k4"}, r"kl\.estimator='k4'.*'k1'"),
        ({"placement": "everywhere"}, r"kl\.placement.*'reward'"),
        ({"beta": -0.1}, r"kl\.beta=-0\.1"),
        ({"placement": "loss", "credit": "reward_to_go"}, r"kl\.credit='reward_to_go'.*placement 'reward'"),
        ({"off_policy": "sequence_weight", "truncation": 1.0}, r"kl\.truncation=1\.0 must be > 1"),
        ({"off_policy": "sequence_weight", "truncation": 0.5}, r"kl\.truncation"),
        ({"truncation": 5.0}, r"kl\.truncation=5\.0.*sequence_weight"),
        ({"scope": "sequence", "estimator": "full"}, r"kl\.scope='sequence'"),
        ({"off_policy": "importance"}, r"kl\.off_policy.*'token_ratio'"),
        ({"placement": "reward", "off_policy": "token_ratio"}, r"kl\.off_policy='token_ratio'"),
        ({"target_kl": 0.0}, r"kl\.target_kl"),
    ],
)
def test_invalid_configs_name_field_and_choices(kwargs, field):
    with pytest.raises(ValueError, match=field):
        KLConfig(**kwargs)


def test_from_mapping_rejects_unknown_fields():
    assert KLConfig.from_mapping({"estimator": "k3", "placement": "loss"}) == KLConfig("k3", "loss")
    with pytest.raises(ValueError, match="unknown kl config field.*estimatr"):
        KLConfig.from_mapping({"estimatr": "k3"})


def test_biased_configs_warn_and_unbiased_do_not():
    with pytest.warns(KLBiasWarning, match="regularizes nothing"):
        warn_if_biased(KLConfig("k1", "loss"))
    with pytest.warns(KLBiasWarning, match="is biased"):
        warn_if_biased(KLConfig("k3", "loss"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_biased(KLConfig("k1", "reward"))
        warn_if_biased(KLConfig(placement="none"))
    assert describe(KLConfig("k3", "reward")).warning is not None


def test_adaptive_beta_moves_toward_target():
    c = KLConfig(beta=0.1, target_kl=1.0, adapt_horizon=10)
    assert float(adapt_beta(0.1, 2.0, c)) > 0.1
    assert float(adapt_beta(0.1, 0.5, c)) < 0.1
    np.testing.assert_allclose(adapt_beta(0.1, 100.0, c), 0.1 * (1 + 0.2 / 10), rtol=1e-6)
    assert float(adapt_beta(0.1, 5.0, KLConfig(beta=0.1))) == pytest.approx(0.1)


def test_kl_configs_cli_json(capsys):
    assert cli_main(["kl-configs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        assert {"name", "estimator", "placement", "credit", "scope", "off_policy", "aggregation", "gradient",
                "unbiased"} <= set(row)
        assert row["aggregation"] == objective.DEFAULT_AGGREGATION
    assert by_name["k1-reward"]["unbiased"] is True and by_name["k1-reward"]["verdict"] == "scaled"
    assert by_name["k1-reward"]["scale"] == pytest.approx(1 / 32)
    assert by_name["k1-loss"]["kl_gradient"].startswith("zero in expectation")
    assert by_name["k3-loss"]["unbiased"] is False
    assert by_name["none"]["unbiased"] is False and "grad E[R]" in by_name["none"]["gradient"]  # not grad J
    assert cli_main(["kl-configs"]) == 0
    assert "k3-loss" in capsys.readouterr().out


def test_kl_configs_table_says_each_thing_once(capsys):
    """The printed table: a biased row's KL reason appears on its "KL part:" line only, and an off-policy
    preset's note does not repeat "off-policy:"."""
    assert cli_main(["kl-configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any("off-policy: off-policy" in line or line.count("off-policy:") > 1 for line in lines)
    k1_loss = next(i for i, line in enumerate(lines) if line.startswith("k1-loss "))
    assert "zero in expectation" not in lines[k1_loss] and "zero in expectation" in lines[k1_loss + 1]
    assert lines[k1_loss].split()[1] == "biased"
    assert cli_main(["kl-configs", "--aggregation", "token-mean"]) == 0
    k1_reward = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("k1-reward "))
    assert "length weighting" in k1_reward  # a reason besides the KL part stays on the first line


def test_kl_configs_cli_aggregation_and_advantage(capsys):
    """Under GRPO's length-normalized aggregation even k1-reward is biased; under seq-mean-token-sum it
    is exactly grad J; Dr. GRPO scales it by (G-1)/G; a stale sampler biases every configuration."""
    rows = lambda *a: (cli_main(["kl-configs", "--json", *a]), json.loads(capsys.readouterr().out))[1]
    by = lambda rs: {r["name"]: r for r in rs}
    mean = by(rows("--aggregation", "seq-mean-token-mean"))
    assert mean["k1-reward"]["verdict"] == "biased" and "length weighting" in mean["k1-reward"]["gradient"]
    assert by(rows("--aggregation", "seq-mean-token-sum"))["k1-reward"]["verdict"] == "unbiased"
    dr = by(rows("--aggregation", "seq-mean-token-sum", "--advantage", "dr_grpo", "--group-size", "4"))
    assert dr["k1-reward"]["verdict"] == "scaled" and dr["k1-reward"]["scale"] == pytest.approx(0.75)
    assert dr["k3-both"]["verdict"] == "biased"
    assert not any(r["unbiased"] for r in rows("--async-level", "2") if r["name"] != "k1-reward-seqw")
    with pytest.raises(SystemExit) as e:  # argparse's choices: exit 2, the valid ones listed
        cli_main(["kl-configs", "--aggregation", "mean"])
    assert e.value.code == 2 and "seq-mean-token-sum-norm" in capsys.readouterr().err


def test_kl_configs_takes_the_sampler_into_account(capsys):
    """The policy trained is the tempered one (the verdict holds, stated for it); a truncating sampler
    (top-p, top-k) or greedy decoding biases every configuration (#38)."""
    rows = lambda *a: (cli_main(["kl-configs", "--json", *a]), json.loads(capsys.readouterr().out))[1]
    tempered = {r["name"]: r for r in rows("--temperature", "0.8")}
    assert tempered["k1-reward"]["verdict"] == "scaled" and "softmax(logits / 0.8)" in tempered["k1-reward"]["gradient"]
    for flags in (("--top-p", "0.9"), ("--top-k", "20"), ("--temperature", "0")):
        assert not any(r["unbiased"] for r in rows(*flags)), flags
    assert cli_main(["kl-configs", "--top-p", "1.5"]) == 2
    assert "--top-p=1.5" in capsys.readouterr().err


def test_shipped_default_run_states_its_tempered_objective():
    """What `kljax train` prints for configs/default.py (temperature 0.8): 1/32 x grad J of the tempered policy."""
    from kljax.config import load_run_config
    from kljax.verdicts.objective import RunObjective, describe_objective

    settings = load_run_config()
    info = describe_objective(RunObjective.from_rl(settings.rl, settings.kl))
    assert settings.rl.temperature == 0.8 and info.verdict == "scaled" and info.scale == pytest.approx(1 / 32)
    assert info.gradient == "1/32 x grad J (for the tempered policy: pi = softmax(logits / 0.8) (rl.temperature), " \
        "pi_ref likewise)"


def test_run_objective_warns_when_the_whole_objective_is_biased():
    from kljax.verdicts.objective import RunObjective

    with pytest.warns(KLBiasWarning, match="length weighting"):
        warn_if_biased(RunObjective(KLConfig("k1", "reward"), "seq-mean-token-mean"))
    with pytest.warns(KLBiasWarning, match="stale samples"):
        warn_if_biased(RunObjective(KLConfig("k1", "reward"), async_level=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_biased(RunObjective(KLConfig("k1", "reward"), max_new_tokens=8)).scale == 1 / 8


def test_grpo_batch_scale_divides_by_the_whole_batchs_std():
    """TRL's scale_rewards="batch": the group mean as baseline, the std (ddof=1) of all B rewards as scale."""
    r = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.7], np.float32)
    g = r.reshape(2, 4)
    want = (g - g.mean(1, keepdims=True)) / (r.std(ddof=1) + 1e-4)
    got = adv.advantages(r, 4, "grpo", scale="batch")
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, adv.advantages(r, 4, "grpo"))  # the group's std differs


def test_rl_settings_of_trl_name_the_bad_value():
    from kljax.config.rl import RLConfig
    from kljax.errors import UserError

    with pytest.raises(UserError, match=r"rl.repetition_penalty=0.0 must be > 0"):
        RLConfig(repetition_penalty=0.0)
    with pytest.raises(UserError, match="rl.advantage_scale='batch'"):
        RLConfig(advantage="rloo", advantage_scale="batch")
    with pytest.raises(UserError, match="advantage_scale"):
        RLConfig(advantage="grpo", advantage_scale="world")
    assert RLConfig(advantage="grpo", advantage_scale="batch").advantage_scale == "batch"


def test_the_verdict_names_a_penalized_sampler_and_masked_truncation():
    from kljax.verdicts.objective import RunObjective, describe_objective

    penalized = describe_objective(RunObjective(KLConfig("k1", "reward"), repetition_penalty=1.2, max_new_tokens=8))
    assert penalized.verdict == "biased" and "repetition_penalty=1.2" in " ".join(penalized.reasons)
    masked = describe_objective(RunObjective(KLConfig("k1", "reward"), mask_truncated=True, max_new_tokens=8))
    assert masked.verdict == "biased" and any("truncat" in r for r in masked.reasons)
    plain = describe_objective(RunObjective(KLConfig("k1", "reward"), max_new_tokens=8))
    assert plain.verdict == "scaled"
