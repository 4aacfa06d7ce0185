"""The measured classification of every PRESETS row (relative bias < 1e-6 by exact enumeration)
matches describe(config), on the tabular and on the tiny transformer policy, on-policy and with a
stale sampler; sequence weights stay unbiased off-policy while truncation does not; and the
Rao-Blackwellized configuration has lower variance than k1 in reward."""

from __future__ import annotations

import jax
import pytest

from kljax.rl.kl import KLConfig
from kljax.studies.bias import catalog
from kljax.studies.bias.engine import Engine
from kljax.studies.bias.gradients import stats_from_moments
from kljax.studies.bias.policies import TabularPolicy, TransformerPolicy
from kljax.studies.bias.setting import make_setting
from kljax.verdicts.kl import describe

CONFIGS = catalog.preset_configs()
EXTRA = (
    KLConfig("k1", "reward", off_policy="sequence_weight", truncation=1.5),
    KLConfig("k1", "reward", credit="reward_to_go", off_policy="sequence_weight"),
    KLConfig("full", "both", credit="reward_to_go", off_policy="sequence_weight"),
)
STALE = 4


def measure(setting, configs, stale):
    with jax.enable_x64(True):
        engine = Engine(setting, configs, chunk_size=32 if setting.policy.kind == "tabular" else 8)
        truth = engine.truth()["kl_grad"]
        on = stats_from_moments(engine.exact(setting.stale(0)), truth, 1)
        off = stats_from_moments(engine.exact(setting.stale(stale)), truth, 1)
    return on, off


@pytest.fixture(scope="module", params=["tabular", "transformer"])
def measured(request):
    with jax.enable_x64(True):
        if request.param == "tabular":
            setting = make_setting(TabularPolicy(3, 3), 0, train_steps=6, max_staleness=4, learning_rate=0.2)
        else:
            setting = make_setting(
                TransformerPolicy(2, 3, n_layers=1), 0, train_steps=4, max_staleness=4, learning_rate=0.01
            )
    configs = CONFIGS + EXTRA
    return request.param, configs, *measure(setting, configs, STALE)


def test_presets_on_policy_match_describe(measured):
    kind, configs, on, _ = measured
    for i, config in enumerate(configs):
        info = describe(config)
        unbiased = on["relative_bias"][i] < 1e-6
        assert unbiased == info.unbiased, (kind, info.name, on["relative_bias"][i])
        if not info.unbiased and config.placement != "none":
            assert on["relative_bias"][i] > 1e-3, (kind, info.name)  # clearly biased, not rounding


def test_presets_off_policy_match_describe(measured):
    """Under a stale sampler: unbiased exactly for the sequence-weighted rows describe() calls
    unbiased off-policy; a truncated weight is exact only where it never clips."""
    kind, configs, _, off = measured
    for i, config in enumerate(configs):
        info = describe(config)
        unbiased = off["relative_bias"][i] < 1e-6
        if config.truncation is not None and off["truncated_fraction"][i] == 0.0:
            assert unbiased, (kind, info.name)  # min(W, C) = W everywhere: the exact weight
            continue
        assert unbiased == info.unbiased_off_policy, (kind, info.name, off["relative_bias"][i])


def test_sequence_weight_unbiased_and_truncation_biased_under_staleness(measured):
    kind, configs, _, off = measured
    index = {describe(c).name: i for i, c in enumerate(configs)}
    assert off["relative_bias"][index["k1-reward-seqw"]] < 1e-9
    assert off["relative_bias"][index["k1-reward"]] > 1e-3  # uncorrected: biased
    trunc = index["k1-reward-seqw1.5"]
    assert off["truncated_fraction"][trunc] > 0.01, kind
    assert off["relative_bias"][trunc] > 1e-3, kind
    # Truncation trades that bias for variance.
    assert off["variance_per_sample"][trunc] < off["variance_per_sample"][index["k1-reward-seqw"]]


def test_rao_blackwellized_variance_is_lower(measured):
    kind, configs, on, off = measured
    index = {describe(c).name: i for i, c in enumerate(configs)}
    var = on["variance_per_sample"]
    assert var[index["full-both-rtg"]] < var[index["k1-reward"]], kind
    # (Reward-to-go credit alone drops zero-mean past terms, which usually but not always lowers the
    # variance: dropping X from Y + X helps only when Var X + 2 Cov(X, Y) > 0. Not asserted.)
    # The same holds for their sequence-weighted, off-policy unbiased versions.
    w = off["variance_per_sample"]
    assert w[index["full-both-rtg-seqw"]] < w[index["k1-reward-seqw"]], kind
    assert off["relative_bias"][index["full-both-rtg-seqw"]] < 1e-9
