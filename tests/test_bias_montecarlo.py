"""Monte-Carlo mode agrees with exact mode within its standard error (fixed seeds), for several
configurations, on-policy and with a stale sampler, on the tabular and the transformer policy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from kljax.studies.bias import catalog
from kljax.studies.bias.engine import Engine
from kljax.studies.bias.gradients import stats_from_moments
from kljax.studies.bias.montecarlo import monte_carlo
from kljax.studies.bias.policies import (
    TabularPolicy,
    TransformerPolicy,
    enumerate_sequences,
    prefix_ids_array,
    sequence_logps,
)
from kljax.studies.bias.setting import make_setting
from kljax.studies.bias.tabular import TabularSpace

CONFIGS = catalog.preset_configs()
CHECKED = [
    "k1-reward",
    "k1-reward-rtg",
    "k1-loss",
    "k3-loss",
    "k3-both",
    "k3-reward",
    "full-both-rtg",
    "k1-reward-seqw",
    "k3-loss-tokratio",
]
SAMPLES, REPEATS = 8, 2048


@pytest.fixture(scope="module")
def tabular():
    with jax.enable_x64(True):
        setting = make_setting(TabularPolicy(3, 3), 0, train_steps=6, max_staleness=4, learning_rate=0.2)
        yield setting, Engine(setting, CONFIGS, chunk_size=32)


@pytest.mark.parametrize("stale", [0, 2])
def test_monte_carlo_agrees_with_exact(tabular, stale):
    """Per coordinate: |m_hat - E g| / (sd_hat / sqrt(R)) < 5 on the logit rows of prefixes the
    sampler reaches with probability >= 5% (rarer rows see too few visits for a normal test); as a
    vector: ||m_hat - E g||^2 is about tr Cov / R (under 4x); variance and MSE within 20%."""
    setting, engine = tabular
    with jax.enable_x64(True):
        behaviour = setting.stale(stale)
        exact_moments = engine.exact(behaviour)
        exact = stats_from_moments(exact_moments, engine.truth()["kl_grad"], SAMPLES)
        mc = monte_carlo(engine, behaviour, jax.random.PRNGKey(stale), SAMPLES, REPEATS)
        seqs = enumerate_sequences(setting.policy)
        q = np.exp(np.sum(np.asarray(sequence_logps(setting.policy.logits(behaviour.base, seqs), seqs)), axis=1))
        ids = np.asarray(prefix_ids_array(3, seqs))
    reach = np.zeros(TabularSpace(3, 3).num_prefixes)
    np.add.at(reach, ids, np.repeat(q[:, None], 3, axis=1))
    well_sampled = np.repeat(reach >= 0.05, 3)  # [P * V], the row-major layout of logits_pv
    stats = mc.stats()
    for name in CHECKED:
        i = CONFIGS.index(catalog.config_from_name(name))
        mean_exact = np.asarray(exact_moments.mean_kd[i])
        coord_var = mc.coord_var_kd[i]
        live = well_sampled & (coord_var > 1e-20)
        z = (mc.mean_kd[i] - mean_exact)[live] / np.sqrt(coord_var[live] / REPEATS)
        assert np.max(np.abs(z)) < 5.0, (name, np.max(np.abs(z)))
        sq_err = float(np.sum((mc.mean_kd[i] - mean_exact) ** 2))
        assert sq_err < 4 * exact["variance"][i] / REPEATS + 1e-24, name
        np.testing.assert_allclose(stats["variance"][i], exact["variance"][i], rtol=0.2, err_msg=name)
        np.testing.assert_allclose(stats["mse"][i], exact["mse"][i], rtol=0.2, err_msg=name)
        if np.linalg.norm(mean_exact) > 10 * np.sqrt(exact["variance"][i] / REPEATS):  # not noise (k1-loss)
            np.testing.assert_allclose(stats["cosine"][i], exact["cosine"][i], atol=0.05, err_msg=name)
        # The MC verdict agrees with the exact one when the bias is many standard errors away or zero.
        exact_unbiased = exact["relative_bias"][i] < 1e-6
        if exact_unbiased or exact["relative_bias"][i] > 6 * stats["bias_stderr"][i]:
            assert bool(stats["unbiased"][i]) == exact_unbiased, name


def test_monte_carlo_transformer_mean_within_standard_error():
    """The transformer's batched per-repeat gradients (generic VJP path) average to the exact mean."""
    with jax.enable_x64(True):
        setting = make_setting(
            TransformerPolicy(2, 3, n_layers=1), 0, train_steps=4, max_staleness=2, learning_rate=0.01
        )
        engine = Engine(setting, CONFIGS, chunk_size=8, mc_chunk_size=1024)
        exact = stats_from_moments(engine.exact(setting.stale(0)), engine.truth()["kl_grad"], 4)
        mc = monte_carlo(engine, setting.stale(0), jax.random.PRNGKey(7), 4, 512)
        exact_mean = engine.exact(setting.stale(0)).mean_kd
    for name in ("k1-reward", "k3-loss", "full-both-rtg"):
        i = CONFIGS.index(catalog.config_from_name(name))
        sq_err = float(np.sum((mc.mean_kd[i] - np.asarray(exact_mean[i])) ** 2))
        assert sq_err < 4 * exact["variance"][i] / 512, name
        np.testing.assert_allclose(mc.stats()["variance"][i], exact["variance"][i], rtol=0.25, err_msg=name)
