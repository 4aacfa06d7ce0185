"""The bias-study engine against first principles: kljax.studies.bias.exact's expected gradients, brute-force
per-sequence Jacobians for the variance, the tiny transformer's causality, the sampler's
distribution, the length mask, and the stale-sampler history."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.rl import estimators as est
from kljax.rl.objective import kl_surrogate
from kljax.studies.bias import catalog, exact
from kljax.studies.bias.engine import Engine
from kljax.studies.bias.gradients import stats_from_moments
from kljax.studies.bias.montecarlo import sample_jit
from kljax.studies.bias.policies import Behaviour, TabularPolicy, TransformerPolicy, enumerate_sequences, sequence_logps
from kljax.studies.bias.setting import make_setting
from kljax.studies.bias.tabular import TabularSpace

CONFIGS = catalog.preset_configs()
TINY_TRANSFORMER = TransformerPolicy(2, 3, n_layers=1)


@pytest.fixture(scope="module")
def tabular():
    """Tabular policy, vocab 3, length 3, trained 6 steps; engine over the presets (float64)."""
    with jax.enable_x64(True):
        setting = make_setting(TabularPolicy(3, 3), 0, train_steps=6, max_staleness=4, learning_rate=0.2)
        yield setting, Engine(setting, CONFIGS, chunk_size=32)


@pytest.fixture(scope="module")
def transformer():
    with jax.enable_x64(True):
        setting = make_setting(TINY_TRANSFORMER, 0, train_steps=4, max_staleness=2, learning_rate=0.01)
        yield setting, Engine(setting, CONFIGS, chunk_size=8)


def per_sequence_jacobians(setting, configs, behaviour_params):
    """[C, N, D]: the gradient of each sequence's kl_surrogate, by jax.jacobian (no engine code),
    and q [N] the sampler's sequence probabilities."""
    policy = setting.policy
    seqs = enumerate_sequences(policy)

    @jax.jit
    def jacobians(params, ref, mu):
        ref_nt = sequence_logps(policy.logits(ref, seqs), seqs)
        sampler_nt = sequence_logps(policy.logits(mu, seqs), seqs)

        def surrogate(p, config):
            logits = policy.logits(p, seqs)
            full = est.full_kl_from_logits(logits, policy.logits(ref, seqs)) if config.estimator == "full" else None
            mask = jnp.ones(seqs.shape, logits.dtype)
            return kl_surrogate(config, sequence_logps(logits, seqs), ref_nt, mask, sampler_nt, full)

        out = []
        for config in configs:
            jac = jax.jacobian(surrogate)(params, config)
            leaves = [x.reshape(seqs.shape[0], -1) for x in jax.tree_util.tree_leaves(jac)]
            out.append(jnp.concatenate(leaves, axis=1))
        return jnp.stack(out), jnp.exp(jnp.sum(sampler_nt, axis=1))

    jac, q = jacobians(setting.theta, setting.ref, behaviour_params)
    return np.asarray(jac), np.asarray(q)


@pytest.mark.parametrize("stale", [0, 4])
def test_engine_matches_exact_module(tabular, stale):
    """Expected gradients equal kljax.studies.bias.exact.exact_gradient for every preset, on- and off-policy."""
    setting, engine = tabular
    with jax.enable_x64(True):
        enum = exact.Enumeration.of(TabularSpace(3, 3))
        moments = engine.exact(setting.stale(stale))
        sampler = setting.theta if stale == 0 else setting.stale(stale).base

        @jax.jit
        def reference(theta, ref, mu):  # every preset's exact.exact_gradient, in one compiled call
            return [exact.exact_gradient(enum, c, theta, ref, None if stale == 0 else mu) for c in CONFIGS]

        for i, want in enumerate(reference(setting.theta, setting.ref, sampler)):
            np.testing.assert_allclose(moments.mean_kd[i], want.reshape(-1), atol=1e-12)
        truth = exact.true_gradient(enum, setting.theta, setting.ref).reshape(-1)
        np.testing.assert_allclose(engine.truth()["kl_grad"], truth, atol=1e-12)


@pytest.mark.parametrize("which", ["tabular", "transformer"])
def test_exact_variance_matches_brute_force(request, which):
    """E_q||g||^2 - ||E_q g||^2 from the engine equals the q-weighted spread of per-sequence
    Jacobians (tabular fast path and the transformer's generic per-sequence VJPs)."""
    setting, engine = request.getfixturevalue(which)
    stale = 2
    names = ["k1-reward", "full-both-rtg", "k3-loss-tokratio"]
    names += ["k3-loss", "k1-reward-seqw"] if which == "tabular" else []
    configs = [catalog.config_from_name(n) for n in names]
    with jax.enable_x64(True):
        moments = engine.exact(setting.stale(stale))
        stats = stats_from_moments(moments, engine.truth()["kl_grad"], samples=1)
        jacs, q = per_sequence_jacobians(setting, configs, setting.stale(stale).base)
    for name, config, jac in zip(names, configs, jacs, strict=True):
        i = CONFIGS.index(config)
        # ravel_pytree and tree_leaves order the transformer's leaves alike (sorted dict keys).
        mean = q @ jac
        var = float(q @ np.sum((jac - mean) ** 2, axis=1))
        np.testing.assert_allclose(moments.mean_kd[i], mean, atol=1e-11, err_msg=name)
        np.testing.assert_allclose(stats["variance_per_sample"][i], var, rtol=1e-8, err_msg=name)


def test_transformer_is_causal():
    policy = TransformerPolicy(4, 5)
    params = policy.init(0)
    logits = jax.jit(policy.logits)
    seqs = jnp.asarray(np.random.default_rng(1).integers(0, 4, (6, 5)), jnp.int32)
    base = logits(params, seqs)
    for t in range(5):
        changed = seqs.at[:, t:].set((seqs[:, t:] + 1) % 4)
        np.testing.assert_allclose(logits(params, changed)[:, : t + 1], base[:, : t + 1], atol=1e-5)
        if t < 4:
            assert not np.allclose(logits(params, changed)[:, t + 1 :], base[:, t + 1 :])
    assert 1000 < policy.num_params() < 10_000
    assert policy.num_params() == policy.flatten(params).size


@pytest.mark.parametrize("policy", [TabularPolicy(2, 3), TINY_TRANSFORMER], ids=["tabular", "transformer"])
def test_sampling_matches_exact_probabilities(policy):
    """Empirical frequencies of 40000 autoregressive samples match the enumerated q(y) (also for a
    logit-space interpolated sampler)."""
    with jax.enable_x64(True):
        a, b = policy.init(0, jnp.float64), policy.init(1, jnp.float64)
        seqs = enumerate_sequences(policy)
        for behaviour in (Behaviour(a), Behaviour(a, b, jnp.asarray(0.5))):
            logits = jax.jit(policy.logits)(a, seqs)
            if behaviour.other is not None:
                logits = logits + 0.5 * (jax.jit(policy.logits)(b, seqs) - logits)
            q = np.exp(np.sum(np.asarray(sequence_logps(logits, seqs)), axis=1))
            n = 40_000
            drawn = np.asarray(sample_jit(policy, n, behaviour, jax.random.PRNGKey(2)))
            index = drawn @ (2 ** np.arange(2, -1, -1))
            freq = np.bincount(index, minlength=8) / n
            np.testing.assert_allclose(freq, q, atol=5 * np.sqrt(q * (1 - q) / n).max())


def test_length_mask_equals_the_shorter_space(tabular):
    """The length-2 study inside the length-3 space equals a length-2 tabular policy made of the
    same prefix rows (prefixes are numbered by length first, so its rows are the first P_2 rows)."""
    setting, engine = tabular
    with jax.enable_x64(True):
        short = TabularPolicy(3, 2)
        p2 = TabularSpace(3, 2).num_prefixes
        enum = exact.Enumeration.of(TabularSpace(3, 2))
        theta, ref = setting.theta[:p2], setting.ref[:p2]
        moments = engine.exact(setting.stale(0), length=2)
        for i, config in enumerate(CONFIGS):
            want = exact.exact_gradient(enum, config, theta, ref).reshape(-1)
            np.testing.assert_allclose(moments.mean_kd[i][: want.size], want, atol=1e-12)
            np.testing.assert_allclose(moments.mean_kd[i][want.size :], 0.0, atol=1e-14)
        truth = engine.truth(2)
        np.testing.assert_allclose(float(truth["kl"]), float(exact.reverse_kl_seq(enum, theta, ref)), rtol=1e-12)
        assert short.num_params() == p2 * 3


def test_stale_history_and_interpolation(tabular):
    setting, engine = tabular
    with jax.enable_x64(True):
        np.testing.assert_array_equal(setting.stale(0).base, setting.theta)
        distances = [engine.kl_between(setting.stale(n)) for n in range(5)]
        assert distances[0] == pytest.approx(0.0, abs=1e-12)
        assert all(b > a for a, b in zip(distances, distances[1:], strict=False))
        assert engine.kl_between(setting.interpolated(0.0)) == pytest.approx(0.0, abs=1e-12)
        assert engine.kl_between(setting.interpolated(0.5)) > engine.kl_between(setting.interpolated(0.1)) > 0
    with pytest.raises(ValueError, match="staleness=9"):
        setting.stale(9)
