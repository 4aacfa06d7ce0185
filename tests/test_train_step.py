"""The train step: sharded equals unsharded, micro-batching equals one batch, and on-policy its
gradient is REINFORCE-with-baseline plus the configured KL gradient of the core functions."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as shd
from kljax.rl import advantages as adv
from kljax.rl.estimators import full_kl_from_logits
from kljax.rl.kl import KLConfig, kl_terms
from kljax.rl.objective import kl_surrogate
from kljax.train import state as st
from kljax.train.step import Batch, StepSettings, batch_shardings, score, train_step

MODEL = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=4, tie_embeddings=False,
)
B, P, R, G = 8, 4, 5, 4


def reference_params(params):
    return jax.tree.map(lambda x: x + 0.05 * jnp.sin(17.0 * x + 1.0), params)


def make_batch(params, kl: KLConfig, seed: int = 0, beta: float = 0.1) -> Batch:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, MODEL.vocab_size, size=(B, P + R)).astype(np.int32)
    prompt_len = rng.integers(1, P + 1, size=B)
    resp_len = rng.integers(1, R + 1, size=B)
    mask = np.zeros((B, P + R), bool)
    for i in range(B):
        mask[i, P - prompt_len[i] : P + resp_len[i]] = True
    tokens = np.where(mask, tokens, 0)
    positions = np.asarray(tfm.positions_from_mask(jnp.asarray(mask)))
    rmask = mask[:, P:].astype(np.float32)
    partial = Batch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(positions), jnp.asarray(rmask),
                    jnp.zeros((B, R)), jnp.zeros((B, R)), jnp.zeros((B, R)), jnp.float32(beta))
    ref_params = reference_params(params)
    full = kl.estimator == "full"
    scored = jax.jit(score, static_argnames=("model", "full_kl"))(params, ref_params, partial, model=MODEL,
                                                                    full_kl=full)
    task = jnp.asarray(rng.normal(size=B), jnp.float32)
    terms = kl_terms(kl, scored["logp"], scored["ref_logp"], rmask, scored["logp"], scored.get("full_kl"))
    a = adv.token_advantages(task, terms.penalty_bt, terms.penalty_b, beta, G, "rloo")
    return Batch(partial.tokens_bs, partial.mask_bs, partial.positions_bs, partial.response_mask_br,
                 scored["logp"], scored["ref_logp"], a, jnp.float32(beta)), task


def run_step(mesh, kl, tx, aggregation="seq-mean-token-mean", micro=1, seed=0, model=MODEL):
    settings = StepSettings(model, kl, loss_aggregation=aggregation, clip_low=None, micro_batches=micro)
    p_sh = st.param_shardings(MODEL, mesh)
    state, s_sh = st.create_state(lambda: tfm.init_params(MODEL, jax.random.PRNGKey(seed), std=0.3), tx, p_sh, mesh, 0)
    batch, _ = make_batch(jax.device_get(state.params), kl)
    batch = jax.device_put(batch, batch_shardings(batch, mesh))
    step = jax.jit(functools.partial(train_step, settings=settings, tx=tx), out_shardings=(s_sh, None),
                   donate_argnums=0)
    old = jax.device_get(state.params)
    ref = jax.device_put(reference_params(old), p_sh)
    with jax.set_mesh(mesh):  # as the trainer runs it: activation sharding constraints on
        new_state, metrics = step(state, batch, ref)
    return old, jax.device_get(new_state.params), metrics


def test_sharded_step_equals_single_device():
    kl = KLConfig("k3", "both", beta=0.1)
    tx = optax.adamw(1e-2)
    one = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    eight = shd.make_mesh(data=1, fsdp=4, tensor=2)
    old, p1, m1 = run_step(one, kl, tx)
    _, p8, m8 = run_step(eight, kl, tx)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), p1, p8)
    np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)
    assert float(jnp.max(jnp.abs(p1["embed"] - old["embed"]))) > 1e-4  # the update did move the params


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum"])
def test_micro_batches_equal_one_batch(aggregation):
    kl = KLConfig("k1", "reward", credit="reward_to_go")
    tx = optax.sgd(1.0)
    mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    _, a, _ = run_step(mesh, kl, tx, aggregation, micro=1)
    _, b, _ = run_step(mesh, kl, tx, aggregation, micro=4)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=5e-6, rtol=1e-4), a, b)


@pytest.mark.parametrize("kl", [KLConfig("k3", "loss"), KLConfig("full", "both")], ids=lambda c: c.estimator)
def test_full_remat_micro_batches_accumulate_in_place_equal_one_batch(kl):
    """remat='full' with micro-batches takes the layers' gradient from the in-place accumulating
    backward (`layer_stack.accumulate_layers`); the update equals one batch without remat, on one
    device and sharded over 8."""
    tx = optax.sgd(1.0)
    full = dataclasses.replace(MODEL, remat="full")
    one = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    old, a, _ = run_step(one, kl, tx, micro=1)
    for mesh in (one, shd.make_mesh(data=2, fsdp=2, tensor=2)):
        _, b, _ = run_step(mesh, kl, tx, micro=4, model=full)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=5e-6, rtol=1e-4), a, b)
    moved = jax.tree.map(lambda o, n: float(np.max(np.abs(o - n))), old["layers"], a["layers"])
    assert min(jax.tree.leaves(moved)) > 1e-4  # a real gradient reached every layer weight


@pytest.mark.parametrize(
    "kl", [KLConfig("k1", "reward"), KLConfig("k1", "reward", credit="reward_to_go"), KLConfig("k3", "loss"),
           KLConfig("k3", "both", credit="reward_to_go"), KLConfig("k2", "loss", scope="sequence"),
           KLConfig("full", "both", credit="reward_to_go")],
    ids=lambda c: f"{c.estimator}-{c.placement}-{c.credit}-{c.scope}",
)
def test_on_policy_gradient_is_reinforce_plus_kl_gradient(kl):
    """With SGD(lr=1) the update is -grad. On-policy, unclipped, seq-mean-token-sum aggregation:
    grad = grad[-sum_b A_b^task sum_t log pi / B] + beta/B grad[sum_b kl_surrogate_b - b_b^KL sum_t log pi],
    where A^task is RLOO on the task reward and b^KL the RLOO baseline of the KL penalty."""
    beta = 0.1
    mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    old, new, _ = run_step(mesh, kl, optax.sgd(1.0), "seq-mean-token-sum")
    step_grad = jax.tree.map(lambda o, n: o - n, old, new)

    batch, task = make_batch(old, kl, beta=beta)
    ref_logp, mask = batch.ref_logp_br, batch.response_mask_br

    ref_params = jax.lax.stop_gradient(reference_params(old))

    def full_kl(params):
        if kl.estimator != "full":
            return None
        logits = [tfm.apply(p, batch.tokens_bs, batch.mask_bs, batch.positions_bs, config=MODEL)[:, P - 1 : -1]
                  for p in (params, ref_params)]
        return full_kl_from_logits(*logits)

    def reference(params):
        scored = score(params, params, batch, MODEL)
        logp = scored["logp"]
        full = full_kl(params)
        seq_logp = jnp.sum(jnp.where(mask > 0, logp, 0.0), axis=1)
        a_task = adv.advantages(task, G, "rloo")
        reinforce = -jnp.sum(a_task * seq_logp) / B
        pen_b = jax.lax.stop_gradient(kl_terms(kl, logp, ref_logp, mask, None, full).penalty_b)
        loo_pen = adv.baseline_and_scale(pen_b, G, "rloo")[0]
        kl_part = jnp.sum(kl_surrogate(kl, logp, ref_logp, mask, None, full)) - jnp.sum(loo_pen * seq_logp)
        return reinforce + beta * kl_part / B

    expected = jax.grad(reference)(old)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-6, rtol=1e-4), step_grad, expected)


def test_nonfinite_step_leaves_state_unchanged():
    kl = KLConfig("k1", "reward")
    tx = optax.adamw(1e-2)
    mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    settings = StepSettings(MODEL, kl)
    state, _ = st.create_state(lambda: tfm.init_params(MODEL, jax.random.PRNGKey(0)), tx,
                               st.param_shardings(MODEL, mesh), mesh, 0)
    batch, _ = make_batch(jax.device_get(state.params), kl)
    batch = Batch(**{**batch.__dict__, "advantages_br": batch.advantages_br.at[0, 0].set(jnp.nan)})
    new, metrics = jax.jit(functools.partial(train_step, settings=settings, tx=tx))(state, batch)
    assert float(metrics["nonfinite"]) == 1.0
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), state.params, new.params)


def test_step_settings_validation():
    with pytest.raises(ValueError, match="loss_aggregation"):
        StepSettings(MODEL, KLConfig(), loss_aggregation="mean")

