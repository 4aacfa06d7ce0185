"""Estimator value identities, float32 stability, masking, and the chunked full-vocabulary KL."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.rl import estimators as est
from kljax.rl.kl import KLConfig, kl_metrics, kl_terms


def _two_distributions(vocab: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=vocab) * 1.5
    ref_logits = logits + rng.normal(size=vocab)
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float64))
    ref = jax.nn.log_softmax(jnp.asarray(ref_logits, jnp.float64))
    return logp, ref


def test_value_identities_by_exact_expectation():
    """E_{y~pi}[k1] = E[k3] = KL(pi||pi_ref); E[k2] != KL; k3+ has k3's value."""
    with jax.enable_x64(True):
        logp, ref = _two_distributions()
        p = jnp.exp(logp)
        kl = jnp.sum(p * (logp - ref))
        d = est.log_ratio(logp, ref)
        assert float(kl) > 0.05
        np.testing.assert_allclose(jnp.sum(p * est.k1(d)), kl, rtol=1e-12)
        np.testing.assert_allclose(jnp.sum(p * est.k3(d)), kl, rtol=1e-12)
        np.testing.assert_allclose(jnp.sum(p * est.k3_plus(d)), kl, rtol=1e-12)
        assert abs(float(jnp.sum(p * est.k2(d)) - kl)) > 1e-3
        # full-vocabulary KL is exact at the prefix, with zero variance.
        full = est.full_kl_from_logits(logp[None, None], ref[None, None])
        np.testing.assert_allclose(full[0, 0], kl, rtol=1e-12)


def test_k3_is_nonnegative_and_k3_plus_has_k2_gradient():
    d = jnp.linspace(-5.0, 5.0, 101)
    assert bool(jnp.all(est.k3(d) >= 0))
    g_plus = jax.grad(lambda x: jnp.sum(est.k3_plus(x)))(d)
    g_k2 = jax.grad(lambda x: jnp.sum(est.k2(x)))(d)
    np.testing.assert_allclose(g_plus, g_k2, rtol=1e-6)
    np.testing.assert_allclose(est.k3_plus(d), est.k3(d), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_float32_at_large_log_ratios(dtype):
    """|d| up to 50: values and gradients finite, computed in float32 whatever the input dtype."""
    logp = jnp.asarray([-50.0, -20.0, -1.0, -1e-3, 0.0], dtype)
    ref = jnp.asarray([0.0, -0.5, -60.0 / 2, -1e-3, -50.0], dtype)
    for name, fn in est.SAMPLE_ESTIMATORS.items():
        d = est.log_ratio(logp, ref)
        assert d.dtype == jnp.float32, name
        value = fn(d)
        grad = jax.grad(lambda x, fn=fn: jnp.sum(fn(est.log_ratio(x, ref))))(logp.astype(jnp.float32))
        assert value.dtype == jnp.float32
        assert bool(jnp.all(jnp.isfinite(value))), name
        assert bool(jnp.all(jnp.isfinite(grad))), name


def test_k3_precision_for_tiny_log_ratios():
    """k3 keeps full float32 relative precision for tiny d, where exp(-d) - 1 + d cancels."""
    d64 = np.array([1e-6, 1e-4, -1e-4, 3e-3, -9e-3, 1.1e-2, 0.2, -0.24, 0.26, 0.5, -3.0])
    truth = np.expm1(-d64) + d64  # float64
    got = est.k3(jnp.asarray(d64, jnp.float32))
    np.testing.assert_allclose(got, truth, rtol=5e-6)
    naive = jnp.exp(-jnp.float32(1e-4)) - 1 + jnp.float32(1e-4)
    assert abs(float(naive) - truth[1]) / truth[1] > 1e-2


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'.*k1"):
        est.sample_estimator("k4")


ALL_CONFIGS = [
    KLConfig("k1", "reward"), KLConfig("k1", "reward", credit="reward_to_go"), KLConfig("k3", "loss"),
    KLConfig("k2", "loss", scope="sequence"), KLConfig("k3", "both", credit="reward_to_go"),
    KLConfig("k3", "loss", off_policy="token_ratio"), KLConfig("k1", "both", off_policy="sequence_weight"),
    KLConfig("full", "both", credit="reward_to_go"),
]


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: f"{c.estimator}-{c.placement}-{c.off_policy}")
def test_masking_ignores_padding_garbage(config):
    """Padding positions may hold -inf/nan log-probs: values equal those of the unpadded batch,
    and gradients are finite and zero on padding."""
    key = jax.random.PRNGKey(3)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    logp = -jax.nn.softplus(jax.random.normal(k1, (3, 5)))
    ref = -jax.nn.softplus(jax.random.normal(k2, (3, 5)))
    sampler = -jax.nn.softplus(jax.random.normal(k3, (3, 5)))
    full = jax.nn.softplus(jax.random.normal(k4, (3, 5)))
    lengths = jnp.asarray([5, 3, 1])
    mask = (jnp.arange(5)[None] < lengths[:, None]).astype(jnp.float32)
    garbage = jnp.where(mask > 0, 0.0, jnp.asarray([[-jnp.inf, jnp.nan, -1e30, jnp.inf, -jnp.inf]]))

    def total(lp, g):
        t = kl_terms(config, lp + g, ref + g, mask, sampler + g, full + g)
        return jnp.sum(t.loss_b) + jnp.sum(t.penalty_bt) + jnp.sum(t.penalty_b), t

    (clean, t_clean), grad_clean = jax.value_and_grad(total, has_aux=True)(logp, jnp.zeros_like(logp))
    (dirty, t_dirty), grad_dirty = jax.value_and_grad(total, has_aux=True)(logp, garbage)
    np.testing.assert_allclose(dirty, clean, rtol=1e-6)
    np.testing.assert_allclose(t_dirty.penalty_bt, t_clean.penalty_bt, rtol=1e-6)
    assert bool(jnp.all(jnp.isfinite(grad_dirty)))
    np.testing.assert_allclose(grad_dirty, grad_clean, rtol=1e-6, atol=1e-7)
    assert bool(jnp.all(jnp.where(mask > 0, 0.0, grad_dirty) == 0))
    assert bool(jnp.all(jnp.where(mask > 0, 0.0, t_dirty.penalty_bt) == 0))


def test_reward_to_go_credit_values():
    """Token t's penalty under reward-to-go is sum_{s>=t} k_s (sum_{s>t} for 'full')."""
    logp = jnp.asarray([[-1.0, -2.0, -0.5, -9.0]])
    ref = jnp.asarray([[-1.5, -1.0, -0.5, -9.0]])
    mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
    d = np.array([0.5, -1.0, 0.0])
    t = kl_terms(KLConfig("k1", "reward", credit="reward_to_go"), logp, ref, mask)
    np.testing.assert_allclose(t.penalty_bt[0], [d.sum(), d[1:].sum(), 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(t.penalty_b, [d.sum()], atol=1e-6)
    seq = kl_terms(KLConfig("k1", "reward"), logp, ref, mask)
    np.testing.assert_allclose(seq.penalty_bt[0], [d.sum()] * 3 + [0.0], atol=1e-6)
    full = jnp.asarray([[0.3, 0.2, 0.1, 5.0]])
    rb = kl_terms(KLConfig("full", "both", credit="reward_to_go"), logp, ref, mask, full_kl_bt=full)
    np.testing.assert_allclose(rb.penalty_bt[0], [0.3, 0.1, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(rb.loss_b, [0.6], atol=1e-6)


def test_kl_metrics_against_numpy():
    rng = np.random.default_rng(0)
    logp, ref = rng.normal(size=(2, 2, 6)) - 2
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], np.float32)
    m = kl_metrics(logp, ref, mask)
    d = (logp - ref)[mask > 0]
    np.testing.assert_allclose(m["k1"], d.mean(), rtol=1e-5)
    np.testing.assert_allclose(m["k2"], (d**2 / 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(m["k3"], (np.exp(-d) - 1 + d).mean(), rtol=1e-5)
    np.testing.assert_allclose(m["kl_seq"], ((logp - ref) * mask).sum(1).mean(), rtol=1e-5)
