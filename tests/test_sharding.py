"""Mesh construction, the logical-axis rules, and sharded == unsharded on a (2, 2, 2) CPU mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from kljax.models import transformer as tf
from kljax.parallel import sharding


def test_mesh_sizes_fill_the_rest_and_errors_say_what_fits():
    assert sharding.resolve_mesh_shape(2, -1, 2, 8) == (2, 2, 2)
    assert sharding.resolve_mesh_shape(1, -1, 1, 8) == (1, 8, 1)
    with pytest.raises(ValueError, match=r"needs 16 devices but 8 are available"):
        sharding.resolve_mesh_shape(2, 2, 4, 8)
    with pytest.raises(ValueError, match=r"multiply to 3.*one of \[1, 2, 4, 8\]"):
        sharding.resolve_mesh_shape(3, -1, 1, 8)
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.resolve_mesh_shape(-1, -1, 1, 8)
    mesh = sharding.make_mesh(2, 2, 2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


def test_logical_rules_shard_divisible_dims_and_replicate_the_rest():
    mesh = sharding.make_mesh(2, 2, 2)
    spec = lambda axes, shape: sharding.logical_to_mesh_spec(P(*axes), shape, mesh)
    assert spec(("layers", "embed", "heads", "head_dim"), (2, 32, 4, 8)) == P(None, "fsdp", "tensor", None)
    assert spec(("layers", "embed", "kv_heads", "head_dim"), (2, 32, 1, 8)) == P(None, "fsdp", None, None)
    assert spec(("vocab", "embed"), (97, 32)) == P(None, "fsdp")
    assert spec(("batch", "length"), (8, 5)) == P(("data", "fsdp"), None)
    assert spec(("batch", "embed"), (8, 32)) == P(("data", "fsdp"), None)  # fsdp already used
    with pytest.raises(ValueError, match="unknown logical axis 'hidden'"):
        spec(("hidden",), (4,))


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    pytest.importorskip("transformers")
    from kljax.models.tiny import save_tiny_hf_model

    return {f: save_tiny_hf_model(f, tmp_path_factory.mktemp(f)) for f in ("qwen3", "llama_tied")}


@pytest.mark.parametrize("family", ["qwen3", "llama_tied"])
def test_sharded_params_give_the_same_logits_and_gradients(tiny_dirs, family):
    from kljax.models.convert import load_hf_checkpoint

    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    params, config = load_hf_checkpoint(tiny_dirs[family])
    sharded, _ = load_hf_checkpoint(tiny_dirs[family], mesh=mesh)
    specs = sharding.describe(jax.tree.map(lambda x: x.sharding, sharded))
    assert specs["['layers']['q']"] == str(P(None, "fsdp", "tensor", None))
    if config.num_kv_heads == 1:  # 1 KV head cannot split over tensor=2: replicated on that dim
        assert specs["['layers']['k']"] == str(P(None, "fsdp", None, None))
    assert all(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(sharded))

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, config.vocab_size, (4, 9)).astype(np.int32)
    mask = np.ones_like(tokens, bool)
    mask[1, :3] = mask[3, :6] = False
    targets = np.roll(tokens, -1, axis=1)

    def loss(p):
        logp = tf.token_logprobs(p, tokens, mask, None, targets, config=config, chunk_size=4)
        return jnp.sum(logp * mask)

    logits = jax.jit(lambda p, t, m: tf.apply(p, t, m, config=config))
    batch = sharding.data_sharding(mesh)
    t_sh, m_sh = jax.device_put(tokens, batch), jax.device_put(mask, batch)
    np.testing.assert_allclose(
        np.asarray(logits(sharded, t_sh, m_sh)), np.asarray(logits(params, tokens, mask)), atol=1e-5
    )
    if family != "qwen3":  # gradients once: the sharded backward compile is the slow part
        return
    grad = jax.jit(jax.value_and_grad(loss))
    (v1, g1), (v2, g2) = grad(sharded), grad(params)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), g1, g2)
    assert g1["layers"]["q"].sharding.is_equivalent_to(sharded["layers"]["q"].sharding, 4)
