"""The in-place optimizer update equals make_optimizer's optax update on the whole tree, and the
train step gives the same result with either."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kljax.config import OptimConfig
from kljax.kernels.cpu.adamw import tree_all_finite, update_in_place, update_is_finite
from kljax.train import state as st


def tree(seed: int, scale: float = 1.0):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    return {
        "embed": scale * jax.random.normal(k[0], (7, 5)),
        "final_norm": scale * jax.random.normal(k[1], (5,)),
        "layers": {"q": scale * jax.random.normal(k[2], (3, 5, 4)), "norm": scale * jax.random.normal(k[3], (3, 5))},
    }


def reference(c, grads, opt_state, params, apply):
    tx = st.make_optimizer(c)
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, o: jnp.where(apply, a, o), new, old)
    return keep(new_params, params), keep(new_opt, opt_state)


CONFIGS = {
    "default": OptimConfig(learning_rate=1e-2),
    "clip_triggers": OptimConfig(learning_rate=1e-2, max_grad_norm=0.5),
    "no_clip_decay_warmup_cosine": OptimConfig(learning_rate=3e-2, max_grad_norm=None, weight_decay=0.1,
                                                  schedule="cosine", warmup_steps=2, total_steps=6),
    "linear_schedule": OptimConfig(learning_rate=1e-2, schedule="linear", total_steps=4, b1=0.8, b2=0.95,
                                      eps=1e-6),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_in_place_update_equals_optax_over_steps(name):
    c = CONFIGS[name]
    params = tree(0)
    ours = theirs = (params, st.make_optimizer(c).init(params))
    ours_fn = jax.jit(lambda g, s, p, n, a: update_in_place(c, st.learning_rate_schedule(c), g, s, p, n, a)[::-1])
    theirs_fn = jax.jit(lambda g, s, p, a: reference(c, g, s, p, a)[::-1])
    for step in range(5):
        grads = tree(10 + step, scale=0.3 * (step + 1))
        apply = jnp.asarray(step != 2)  # step 2 is "non-finite": nothing may change, counts included
        norm = optax.tree.norm(grads)
        o_state, o_params = ours_fn(grads, ours[1], ours[0], norm, apply)
        t_state, t_params = theirs_fn(grads, theirs[1], theirs[0], apply)
        assert jax.tree.structure(o_state) == jax.tree.structure(t_state)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7), (o_params, o_state),
                     (t_params, t_state))
        if step == 2:
            jax.tree.map(np.testing.assert_array_equal, (o_params, o_state), (ours[0], ours[1]))
        ours, theirs = (o_params, o_state), (t_params, t_state)
    assert int(ours[1][-1][0].count) == 4  # 5 steps, one skipped
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), ours[0], params)
    assert min(jax.tree.leaves(moved)) > 0  # every leaf, stacked layers included, was updated


def test_in_place_update_rejects_foreign_state():
    params = tree(0)
    with pytest.raises(TypeError, match="make_optimizer"):
        c = OptimConfig()
        update_in_place(c, st.learning_rate_schedule(c), params, optax.sgd(0.1).init(params), params, jnp.float32(1.0),
                        jnp.asarray(True))


def test_train_step_same_with_config_or_transformation():
    from kljax.models import transformer as tfm
    from kljax.rl.kl import KLConfig
    from kljax.train.step import StepSettings, train_step
    from tests.test_train_step import MODEL, make_batch

    c = OptimConfig(learning_rate=1e-2, max_grad_norm=0.1, weight_decay=0.01)
    tx = st.make_optimizer(c)
    kl = KLConfig("k3", "loss", beta=0.1)
    settings = StepSettings(MODEL, kl, clip_low=0.2, micro_batches=2)
    params = tfm.init_params(MODEL, jax.random.PRNGKey(0), std=0.3)
    batch, _ = make_batch(params, kl)
    fresh = lambda: st.TrainState(jax.tree.map(jnp.copy, params), tx.init(params), jnp.int32(0),
                                  jax.random.key_data(jax.random.PRNGKey(0)))
    results = []
    for opt in (tx, c):
        step = jax.jit(functools.partial(train_step, settings=settings, tx=opt), donate_argnums=0)
        s, metrics = step(fresh(), batch)
        s, metrics = step(s, dataclasses.replace(batch, advantages_br=-batch.advantages_br))
        results.append((s, metrics))
    (a, ma), (b, mb) = results
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-6, atol=1e-7), (a, ma), (b, mb))
    assert float(jnp.max(jnp.abs(a.params["layers"]["q"] - params["layers"]["q"]))) > 0


def test_accumulate_layers_gradient_is_accumulator_plus_gradient():
    """d/dlayers of a loss on `accumulate_layers` = acc + d/dlayers of the same loss on the plain
    layer scan; the input's gradient is the plain one; acc gets none."""
    from kljax.models import transformer as tfm
    from kljax.models.layer_stack import accumulate_layers
    from tests.test_train_step import MODEL

    params = tfm.init_params(MODEL, jax.random.PRNGKey(1), std=0.3)
    acc = jax.tree.map(lambda x: jnp.cos(3.0 * x), params["layers"])
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, MODEL.hidden_size))
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    rope = tfm.rope_tables(positions, MODEL)
    allowed = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (2, 5, 5))
    w = jax.random.normal(jax.random.PRNGKey(3), x.shape)

    def plain(layers, x):
        for i in range(MODEL.num_layers):
            x, _ = tfm.decoder_layer(x, jax.tree.map(lambda a, i=i: a[i], layers), rope, allowed, None, i, None, MODEL)
        return jnp.sum(jnp.sin(x) * w)

    ours = lambda layers, x: jnp.sum(jnp.sin(accumulate_layers(layers, acc, x, rope, allowed, MODEL)) * w)
    np.testing.assert_allclose(ours(params["layers"], x), plain(params["layers"], x), rtol=1e-5)  # float32 sums
    g_ours = jax.jit(jax.grad(ours, argnums=(0, 1)))(params["layers"], x)
    g_plain = jax.jit(jax.grad(plain, argnums=(0, 1)))(params["layers"], x)
    expected = (jax.tree.map(jnp.add, acc, g_plain[0]), g_plain[1])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g_ours, expected)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_finiteness_checks_find_every_non_finite_element(bad):
    """tree_all_finite and update_is_finite under jit: False for one inf or NaN anywhere in the
    parameters, moments or gradients, True for a finite update."""
    c = OptimConfig(learning_rate=1e-2)
    params, grads = tree(0), tree(1)
    opt_state = st.make_optimizer(c).init(params)
    check = jax.jit(lambda g, s, p: update_is_finite(c, st.learning_rate_schedule(c), g, s, p, optax.tree.norm(g)))
    assert bool(jax.jit(tree_all_finite)(params)) and bool(check(grads, opt_state, params))
    for where in ("params", "mu", "nu"):
        p, s = params, opt_state
        if where == "params":
            p = {**params, "layers": {**params["layers"], "q": params["layers"]["q"].at[2, 4, 3].set(bad)}}
            assert not bool(jax.jit(tree_all_finite)(p))
        else:
            adam = s[-1][0]
            moment = getattr(adam, where)
            moment = {**moment, "embed": moment["embed"].at[6, 1].set(bad)}
            s = (*s[:-1], (adam._replace(**{where: moment}), *s[-1][1:]))
        assert not bool(check(grads, s, p)), where


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # learning rate 1e39 in float32
def test_update_is_finite_catches_overflow_and_adds_no_temporary_to_the_update():
    c = OptimConfig(learning_rate=1e-2, max_grad_norm=None)  # no clip: the gradients reach the moments
    params, grads = tree(0), tree(1)
    opt_state = st.make_optimizer(c).init(params)
    check = jax.jit(lambda g, s, p: update_is_finite(c, st.learning_rate_schedule(c), g, s, p, optax.tree.norm(g)))
    assert bool(check(grads, opt_state, params))
    huge = jax.tree.map(lambda g: g * 1e30, grads)  # g**2 overflows the second moment
    assert not bool(check(huge, opt_state, params))
    huge = dataclasses.replace(c, learning_rate=1e39)
    assert not bool(jax.jit(lambda g, s, p: update_is_finite(huge, st.learning_rate_schedule(huge), g, s, p,
                                                               optax.tree.norm(g)))(grads, opt_state, params))
    # The check before the in-place update fuses into its reductions: XLA's temporaries for the
    # update are the same with it as without it (an `all` per array wrote 0.9x the parameters' bytes).
    c = OptimConfig(learning_rate=1e-2)
    big = {"layers": {"w": jnp.zeros((4, 256, 512))}, "embed": jnp.zeros((1024, 256))}
    big_state = st.make_optimizer(c).init(big)

    def update(g, s, p, checked):
        norm = optax.tree.norm(g)
        ok = update_is_finite(c, st.learning_rate_schedule(c), g, s, p, norm) if checked else jnp.isfinite(norm)
        return update_in_place(c, st.learning_rate_schedule(c), g, s, p, norm, ok)

    temps = [jax.jit(functools.partial(update, checked=checked), donate_argnums=(1, 2)).lower(big, big_state, big)
             .compile().memory_analysis().temp_size_in_bytes for checked in (False, True)]
    param_bytes = sum(x.size * 4 for x in jax.tree.leaves(big))
    assert temps[1] - temps[0] < 0.05 * param_bytes, temps
