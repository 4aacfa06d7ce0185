"""LoRA adapters (kljax/models/lora.py): the adapted model starts equal to the base under every
kernel, remat and scan setting; merged equals unmerged; the train step's adapter gradient is the
chain rule of jax.grad of the merged model; sharded equals unsharded; the sampler's log-probs equal
the teacher-forced ones with adapters on."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kljax import sampling
from kljax.config.sections import LoraConfig
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as shd
from kljax.rl import objective as obj
from kljax.rl.kl import KLConfig
from kljax.train import state as st
from kljax.train.step import Batch, StepSettings, _loss_fn, batch_shardings, score, train_step

BASE = ModelConfig(
    architecture="Qwen2ForCausalLM", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=True, tie_embeddings=False,
)
MODEL = dataclasses.replace(BASE, lora=LoraConfig(rank=2, alpha=6.0))
B, P, R = 8, 4, 5


def _params(model=MODEL, seed=0, b_scale=0.3):
    """(base, adapters) with random nonzero B (b_scale 0: the initial, zero B)."""
    base = tfm.init_params(model, jax.random.PRNGKey(seed), std=0.3)
    adapters = lora.init_adapters(model, jax.random.PRNGKey(seed + 1))
    key = jax.random.PRNGKey(seed + 2)
    adapters = {"layers": {k: v + b_scale * jax.random.normal(jax.random.fold_in(key, i), v.shape)
                           if k.endswith("_lora_b") else v for i, (k, v) in enumerate(adapters["layers"].items())}}
    return base, adapters


def _tokens(seed=0, b=2, t=7):
    return jax.random.randint(jax.random.PRNGKey(100 + seed), (b, t), 0, MODEL.vocab_size)


@pytest.mark.parametrize(("kernels", "remat", "scan"), [
    ("plain", "none", True), ("cpu", "full", False), ("plain", "dots_saveable", False),
    ("cpu", "dots_no_batch_saveable", True)])
def test_fresh_adapters_equal_the_base_and_merged_equals_unmerged(kernels, remat, scan):
    model = dataclasses.replace(MODEL, kernels=kernels, remat=remat, scan_layers=scan)
    base, trained = _params(model)
    fresh = lora.init_adapters(model, jax.random.PRNGKey(5))
    tokens = _tokens()
    logits = lambda p: tfm.apply(p, tokens, config=model)
    np.testing.assert_array_equal(logits(base), logits(lora.combine(base, fresh)))  # B = 0: exactly the base
    adapted = logits(lora.combine(base, trained))
    assert float(jnp.max(jnp.abs(adapted - logits(base)))) > 1e-2  # the adapters do act
    np.testing.assert_allclose(adapted, logits(lora.merge(lora.combine(base, trained), model)), atol=2e-5)
    # gradients reach every adapter under this remat/scan/kernel setting
    loss = lambda a: jnp.sum(jax.nn.log_softmax(logits(lora.combine(base, a)))[..., 3])
    grads = jax.grad(loss)(trained)
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads))


def test_targets_and_shapes_follow_the_config():
    model = dataclasses.replace(BASE, lora=LoraConfig(rank=3, alpha=3.0, targets=("q", "o", "down")))
    adapters = lora.init_adapters(model, jax.random.PRNGKey(0))["layers"]
    assert sorted(adapters) == ["down_lora_a", "down_lora_b", "o_lora_a", "o_lora_b", "q_lora_a", "q_lora_b"]
    assert adapters["q_lora_a"].shape == (2, 16, 3) and adapters["q_lora_b"].shape == (2, 3, 4, 4)
    assert adapters["o_lora_a"].shape == (2, 4, 4, 3) and adapters["o_lora_b"].shape == (2, 3, 16)
    assert all(a.dtype == jnp.float32 for a in adapters.values())
    assert lora.count(model) == sum(a.size for a in adapters.values())
    with pytest.raises(ValueError, match="model.lora.targets='q,x'"):
        LoraConfig(rank=2, targets=("q", "x"))
    with pytest.raises(ValueError, match="model.lora.rank"):
        LoraConfig(rank=0)


def test_adapters_shard_like_their_base_weights():
    mesh = shd.make_mesh(data=1, fsdp=4, tensor=2)
    sh = st.adapter_shardings(MODEL, mesh)["layers"]
    assert sh["q_lora_a"].spec == jax.sharding.PartitionSpec(None, "fsdp", None)  # D over fsdp, rank replicated
    assert sh["q_lora_b"].spec == jax.sharding.PartitionSpec(None, None, "tensor", None)  # heads over tensor
    assert sh["down_lora_a"].spec == jax.sharding.PartitionSpec(None, "tensor", None)


def _batch(params, ref_params, beta=0.1, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, MODEL.vocab_size, size=(B, P + R)).astype(np.int32)
    mask = np.zeros((B, P + R), bool)
    for i in range(B):
        mask[i, P - rng.integers(1, P + 1): P + rng.integers(1, R + 1)] = True
    tokens = np.where(mask, tokens, 0)
    positions = np.asarray(tfm.positions_from_mask(jnp.asarray(mask)))
    rmask = mask[:, P:].astype(np.float32)
    partial = Batch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(positions), jnp.asarray(rmask),
                    jnp.zeros((B, R)), jnp.zeros((B, R)), jnp.zeros((B, R)), jnp.float32(beta))
    scored = score(params, ref_params, partial, MODEL)
    adv = jnp.asarray(rng.normal(size=(B, 1)), jnp.float32) * jnp.asarray(rmask)
    return dataclasses.replace(partial, sampler_logp_br=scored["logp"], ref_logp_br=scored["ref_logp"],
                               advantages_br=adv)


@pytest.mark.parametrize("kl", [KLConfig("k3", "both"), KLConfig("full", "loss")], ids=["k3-both", "full-loss"])
def test_adapter_gradient_is_the_chain_rule_of_the_merged_models_gradient(kl):
    """SGD(1): the step moves the adapters by -grad. With G = dL/dW at the merged weights W + s A.B
    (jax.grad of the plain, merged model's loss), dL/dA = s G B^T and dL/dB = s A^T G."""
    base, adapters = _params()
    batch = _batch(lora.combine(base, adapters), base)
    settings = StepSettings(MODEL, kl, loss_aggregation="seq-mean-token-sum", clip_low=None)
    tx = optax.sgd(1.0)
    state = st.TrainState(adapters, tx.init(adapters), jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.uint32))
    new, _ = jax.jit(functools.partial(train_step, settings=settings, tx=tx))(state, batch, base)
    step_grad = jax.tree.map(lambda o, n: o - n, adapters, new.params)["layers"]

    plain = dataclasses.replace(MODEL, lora=None)
    plain_settings = dataclasses.replace(settings, model=plain)
    merged = lora.merge(lora.combine(base, adapters), MODEL)
    den = obj.denominator(batch.response_mask_br, settings.loss_aggregation)
    g = jax.grad(lambda p: _loss_fn(p, batch, den, plain_settings, base)[0])(merged)["layers"]
    s = MODEL.lora.scale
    for t in MODEL.lora.targets:
        a, b = adapters["layers"][f"{t}_lora_a"], adapters["layers"][f"{t}_lora_b"]
        n, r = a.shape[0], a.shape[-1]
        g_t = g[t].reshape(n, a[0].size // r, -1)
        expect_a = s * jnp.einsum("lio,lro->lir", g_t, b.reshape(n, r, -1)).reshape(a.shape)
        expect_b = s * jnp.einsum("lir,lio->lro", a.reshape(n, -1, r), g_t).reshape(b.shape)
        np.testing.assert_allclose(step_grad[f"{t}_lora_a"], expect_a, atol=2e-6, rtol=2e-4)
        np.testing.assert_allclose(step_grad[f"{t}_lora_b"], expect_b, atol=2e-6, rtol=2e-4)
        assert float(jnp.max(jnp.abs(expect_a))) > 1e-5 and float(jnp.max(jnp.abs(expect_b))) > 1e-5


def _sharded_step(mesh, kl, micro=1, model=MODEL):
    base, adapters = _params()
    batch = _batch(lora.combine(base, adapters), base)
    tx = optax.adamw(1e-2)
    settings = StepSettings(model, kl, loss_aggregation="seq-mean-token-mean", clip_low=None, micro_batches=micro)
    state, s_sh = st.create_state(lambda: adapters, tx, st.adapter_shardings(model, mesh), mesh, 0)
    base = jax.device_put(base, st.param_shardings(model, mesh))
    batch = jax.device_put(batch, batch_shardings(batch, mesh))
    step = jax.jit(functools.partial(train_step, settings=settings, tx=tx), out_shardings=(s_sh, None),
                   donate_argnums=0)
    with jax.set_mesh(mesh):
        new, metrics = step(state, batch, base)
    return adapters, jax.device_get(new.params), metrics


def test_sharded_lora_step_equals_single_device_and_micro_batches_equal_one_batch():
    kl = KLConfig("k3", "both", beta=0.1)
    one = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    old, p1, m1 = _sharded_step(one, kl)
    _, p8, m8 = _sharded_step(shd.make_mesh(data=1, fsdp=4, tensor=2), kl)
    _, pm, _ = _sharded_step(shd.make_mesh(data=2, fsdp=2, tensor=2), kl, micro=2,
                             model=dataclasses.replace(MODEL, remat="full"))
    for other in (p8, pm):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), p1, other)
    np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)
    moved = jax.tree.map(lambda o, n: float(np.max(np.abs(o - n))), old, p1)
    assert min(jax.tree.leaves(moved)) > 1e-4  # every adapter moved


@pytest.mark.parametrize("kernels", ["plain", "cpu"])  # plain: adapters unmerged; cpu: merged into the decode weights
def test_sampler_logprobs_equal_teacher_forced_with_adapters(kernels):
    model = dataclasses.replace(MODEL, kernels=kernels)
    base, adapters = _params()
    params = lora.combine(base, adapters)
    tokens = np.asarray(_tokens(b=3, t=6))
    mask = np.ones_like(tokens, bool)
    mask[0, :2] = False
    sp = sampling.SamplingParams(max_new_tokens=12, temperature=1.0, n=2)
    out = sampling.generate(params, model, tokens, mask, jax.random.key(1), sp)
    forced = sampling.response_logprobs(params, out, config=model)
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), np.asarray(forced), atol=1e-4)
    base_forced = sampling.response_logprobs(base, out, config=model)
    assert float(np.max(np.abs(np.asarray(base_forced) - np.asarray(forced)))) > 1e-2  # sampled with adapters
