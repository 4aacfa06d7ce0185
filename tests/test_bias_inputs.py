"""Bad inputs to the bias study fail early with ValueErrors that name the value and the valid range."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import pytest

from kljax import cli
from kljax.studies.bias import catalog, policies, study
from kljax.studies.bias.engine import Engine
from kljax.studies.bias.montecarlo import monte_carlo
from kljax.studies.bias.setting import make_setting

ROOT = Path(__file__).resolve().parents[1]


def default_config():
    spec = importlib.util.spec_from_file_location("bias_default", ROOT / "configs" / "bias_default.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.mark.parametrize(
    ("vocab", "length", "match"),
    [
        (9, 3, r"vocab=9 .*2 <= vocab <= 8"),
        (1, 3, r"vocab=1 .*2 <= vocab <= 8"),
        (3, 9, r"length=9 .*1 <= length <= 8"),
        (3, 0, r"length=0 .*1 <= length <= 8"),
    ],
)
def test_vocab_and_length_out_of_range(vocab, length, match):
    with pytest.raises(ValueError, match=match):
        policies.make_policy("tabular", vocab, length)
    cfg = default_config()
    cfg.vocab, cfg.length = vocab, length
    with pytest.raises(ValueError, match=match):
        study.validate(cfg)


def test_too_large_to_enumerate_names_the_size_before_allocating():
    with pytest.raises(ValueError, match=r"vocab=8, length=8: .*16,777,216 sequences.*GiB.*budget"):
        policies.check_enumeration(8, 8, n_streams=18, n_params=8 * 2396745)
    cfg = default_config()
    cfg.vocab, cfg.length, cfg.lengths = 8, 8, (8,)
    with pytest.raises(ValueError, match=r"vocab=8, length=8: .* GiB"):
        study.run_study(cfg)  # fails in build(), before the setting is trained
    # A tight budget also refuses a small space, naming the estimate.
    with pytest.raises(ValueError, match=r"vocab=4, length=6: .* GiB, over the memory budget of 0.00 GiB"):
        policies.check_enumeration(4, 6, 18, 5460, budget_bytes=1000)


@pytest.mark.parametrize("samples", [0, -3])
def test_zero_or_negative_samples(samples):
    cfg = default_config()
    cfg.samples = samples
    with pytest.raises(ValueError, match=rf"samples={samples} must be an integer >= 1"):
        study.validate(cfg)
    cfg = default_config()
    cfg.sample_counts = (4, samples)
    with pytest.raises(ValueError, match=rf"sample_counts has {samples}; .* >= 1"):
        study.validate(cfg)


def test_monte_carlo_rejects_bad_samples_and_repeats():
    with jax.enable_x64(True):
        setting = make_setting(policies.TabularPolicy(2, 2), 0, train_steps=1, max_staleness=1)
        engine = Engine(setting, catalog.resolve("k1-reward"), chunk_size=4)
        with pytest.raises(ValueError, match=r"samples=0 must be an integer >= 1"):
            monte_carlo(engine, setting.stale(0), jax.random.PRNGKey(0), 0, 10)
        with pytest.raises(ValueError, match=r"repeats=1 must be an integer >= 2"):
            monte_carlo(engine, setting.stale(0), jax.random.PRNGKey(0), 4, 1)
        with pytest.raises(ValueError, match=r"length=3 is out of range: .* 1..2"):
            engine.exact(setting.stale(0), length=3)


@pytest.mark.parametrize("name", ["k9-reward", "k1-rewards", "k1-reward-xyz", "k1-loss-rtg", "kl"])
def test_unknown_config_names_list_the_valid_ones(name):
    with pytest.raises(ValueError, match=rf"unknown KL configuration name '{name}'.*presets.*k1-reward"):
        catalog.resolve(name)
    cfg = default_config()
    cfg.configs = f"k1-reward,{name}"
    with pytest.raises(ValueError, match="unknown KL configuration name"):
        study.validate(cfg)


def test_config_names_round_trip():
    for config in catalog.grid_configs((1.5, 10.0)):
        assert catalog.config_from_name(catalog.config_name(config)) == config.replace(beta=config.beta)
    assert len(catalog.resolve("grid")) > 60
    assert [catalog.config_name(c) for c in catalog.resolve("k3-loss, k1-reward")] == ["k3-loss", "k1-reward"]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("policy", "lstm", r"policy='lstm' is unknown; valid policies: \['tabular', 'transformer'\]"),
        ("mode", "fast", r"mode='fast' is unknown; valid modes"),
        ("optimizer", "lion", r"optimizer='lion' is unknown"),
        ("lengths", (0, 3), r"lengths has 0; each value must be an integer in 1..6"),
        ("lengths", (7,), r"lengths has 7; each value must be an integer in 1..6"),
        ("staleness_steps", (0, 99), r"staleness_steps has 99; .* in 0..16"),
        ("truncations", (1.0,), r"truncations has 1.0; each value must be a number > 1"),
        ("alphas", (1.5,), r"alphas has 1.5; .*<= 1"),
        ("repeats", 1, r"repeats=1 must be an integer >= 2"),
    ],
)
def test_study_config_errors(field, value, match):
    cfg = default_config()
    cfg[field] = value
    with pytest.raises(ValueError, match=match):
        study.validate(cfg)


def test_cli_reports_bad_input_and_exits_2(capsys):
    assert cli.main(["bias-study", "--samples", "0", "--no-progress"]) == 2
    assert "samples=0 must be an integer >= 1" in capsys.readouterr().err
    assert cli.main(["bias-study", "--config.vocab=12", "--no-progress"]) == 2
    assert "vocab=12" in capsys.readouterr().err
    assert cli.main(["bias-study", "--configs", "k1-rewardz", "--no-progress"]) == 2
    assert "unknown KL configuration name 'k1-rewardz'" in capsys.readouterr().err
