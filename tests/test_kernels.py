"""model.kernels: the XLA-CPU kernels equal the plain-JAX path in value and gradient, and the remat
policies save what their names say under both."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.models import layers
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig

BASE = ModelConfig(
    architecture="LlamaForCausalLM", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=4, tie_embeddings=False, scan_layers=False,
)
PLAIN, CPU = dataclasses.replace(BASE, kernels="plain"), dataclasses.replace(BASE, kernels="cpu")


def test_kernels_setting():
    assert PLAIN.cpu_kernels is False and CPU.cpu_kernels is True
    assert dataclasses.replace(BASE, kernels="auto").cpu_kernels == (jax.default_backend() == "cpu")
    with pytest.raises(ValueError, match=r"model.kernels='gpu'.*'plain'"):
        dataclasses.replace(BASE, kernels="gpu")


def _close(a, b, tol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                                         atol=tol, rtol=tol), a, b)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("bfloat16", 3e-2)])
def test_each_cpu_kernel_equals_plain_in_value_and_gradient(dtype, tol):
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)
    x = jnp.asarray(rng.normal(size=(2, 5, 16)), dt)
    w = jnp.asarray(rng.normal(size=(16, 4, 4)) / 4, dt)
    q = jnp.asarray(rng.normal(size=(2, 5, 4, 4)), dt)
    kv = jnp.asarray(rng.normal(size=(2, 2, 5, 2, 4)), dt)
    allowed = jnp.tril(jnp.ones((5, 5), bool))[None].repeat(2, 0).at[1, :2].set(False)  # masked rows too
    scale = jnp.asarray(rng.normal(size=(16,)) + 1, dt)
    cases = {
        "project": lambda c, x, w: layers.project(x, w, 1, c),
        "attention": lambda c, q, k, v: layers.attention(q, k, v, allowed, c),
        "rms_norm": lambda c, x, s: layers.rms_norm(x, s, 1e-6, c),
    }
    inputs = {"project": (x, w), "attention": (q, kv[0], kv[1]), "rms_norm": (x, scale)}
    for name, fn in cases.items():
        args = inputs[name]
        loss = lambda c, *a, fn=fn: jnp.sum(jnp.sin(fn(c, *a).astype(jnp.float32)))
        argnums = tuple(range(1, len(args) + 1))
        _close(fn(CPU, *args), fn(PLAIN, *args), tol)
        _close(jax.grad(loss, argnums)(CPU, *args), jax.grad(loss, argnums)(PLAIN, *args), tol)
    angles = jnp.asarray(rng.normal(size=(2, 5, 2)), jnp.float32)
    _close(layers.rope_cs(angles, CPU), layers.rope_cs(angles, PLAIN), 0)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 5e-2)])
def test_whole_model_cpu_kernels_equal_plain(dtype, tol):
    params = tfm.init_params(BASE, jax.random.PRNGKey(0), std=0.3)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 0, 32)
    mask = jnp.ones((2, 6), bool).at[0, :2].set(False)
    pos = tfm.positions_from_mask(mask)

    def loss(p, c):
        c = dataclasses.replace(c, dtype=dtype)
        return jnp.sum(tfm.token_logprobs(p, tokens, mask, pos, tokens, config=c) * mask)

    _close(loss(params, CPU), loss(params, PLAIN), tol * 10)
    _close(jax.grad(loss)(params, CPU), jax.grad(loss)(params, PLAIN), tol)


def _saved(config: ModelConfig) -> list[str]:
    """Residuals the backward of one remat'ed forward keeps: (shape, what produced it) per residual."""
    params = tfm.init_params(config, jax.random.PRNGKey(0))
    tokens = jnp.zeros((2, 6), jnp.int32)
    mask = jnp.ones((2, 6), bool)
    f = lambda p: jnp.sum(tfm.forward_hidden(p, tokens, mask, tfm.positions_from_mask(mask), config)[0])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(f, params)
    return printed.getvalue().splitlines()


def _n_dot_residuals(config: ModelConfig) -> int:
    return sum("dot_general" in s for s in _saved(config))


def test_remat_policies_save_what_they_say():
    """Counted from the saved residuals that are dot outputs, per layer, under both kernel settings:
    full keeps none; dots_no_batch_saveable keeps the weight projections' outputs the backward
    needs (6 of the 7); dots_saveable those and attention's two batched dots (scores, p v). The
    CPU kernels' custom-VJP matmul and attention keep their dots visible to the policies."""
    counts = {}
    for base in (PLAIN, CPU):
        for remat in ("full", "dots_saveable", "dots_no_batch_saveable"):
            counts[base.kernels, remat] = _n_dot_residuals(dataclasses.replace(base, remat=remat))
    n = BASE.num_layers
    for k in ("plain", "cpu"):
        assert counts[k, "full"] == 0, counts
        assert counts[k, "dots_no_batch_saveable"] == 6 * n, counts
        assert counts[k, "dots_saveable"] == 8 * n, counts


@pytest.mark.parametrize("mesh_shape", [None, (2, 2, 2)], ids=["one-device", "sharded"])
def test_plain_decode_path_equals_cpu_decode_layout(mesh_shape):
    """Under plain kernels the sampler decodes with the model's own forward over its KVCache; the
    tokens (greedy), sampler log-probs and entropies equal the CPU decode layout's, and the
    log-probs equal teacher-forced ones."""
    from kljax import sampling
    from kljax.parallel import sharding as shd

    mesh = None if mesh_shape is None else shd.make_mesh(*mesh_shape)
    params = tfm.init_params(BASE, jax.random.PRNGKey(3), std=0.5)
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(4), (4, 5), 1, 32))
    mask = np.ones((4, 5), bool)
    mask[0, :2] = False
    sp = sampling.SamplingParams(max_new_tokens=6, greedy=True, n=2, entropy=True)
    outs = {c.kernels: sampling.generate(params, c, tokens, mask, jax.random.PRNGKey(0), sp, mesh=mesh)
            for c in (PLAIN, CPU)}
    np.testing.assert_array_equal(outs["plain"].response_tokens_rn, outs["cpu"].response_tokens_rn)
    for field in ("response_logprobs_rn", "response_entropy_rn"):
        _close(getattr(outs["plain"], field), getattr(outs["cpu"], field), 1e-5)
    tf = sampling.response_logprobs(params, outs["plain"], config=PLAIN)
    _close(tf, outs["plain"].response_logprobs_rn, 1e-5)
