"""Shapes without weights: full-size configs via jax.eval_shape, logical axes, config round trips."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from kljax.models import transformer as tf
from kljax.models.config import ModelConfig, num_params
from kljax.models.known_configs import KNOWN_CONFIGS, LLAMA_3_1_8B, QWEN2_5_7B, QWEN3_4B


@pytest.mark.parametrize(
    "hf, billions", [(QWEN2_5_7B, "7.62"), (LLAMA_3_1_8B, "8.03"), (QWEN3_4B, "4.02")]
)
def test_eval_shape_parameter_counts_of_full_size_models(hf, billions):
    config = ModelConfig.from_hf(hf, param_dtype="bfloat16")
    shapes = tf.param_shapes(config)  # jax.eval_shape: nothing allocated
    leaves = jax.tree.leaves(shapes)
    assert all(isinstance(x, jax.ShapeDtypeStruct) and x.dtype == jnp.bfloat16 for x in leaves)
    count = tf.count_params(shapes)
    assert f"{count / 1e9:.2f}" == billions
    assert count == num_params(config)


def test_eval_shape_of_forward_on_abstract_8b_params():
    config = ModelConfig.from_hf(LLAMA_3_1_8B, param_dtype="bfloat16", dtype="bfloat16")
    tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    mask = jax.ShapeDtypeStruct((2, 16), jnp.bool_)
    out = jax.eval_shape(
        lambda p, t, m: tf.apply(p, t, m, config=config), tf.param_shapes(config), tokens, mask
    )
    assert out.shape == (2, 16, 128256) and out.dtype == jnp.float32
    logp = jax.eval_shape(
        lambda p, t, m: tf.token_logprobs(p, t, m, None, t, config=config, chunk_size=8),
        tf.param_shapes(config), tokens, mask,
    )
    assert logp.shape == (2, 16) and logp.dtype == jnp.float32


@pytest.mark.parametrize("name", sorted(KNOWN_CONFIGS))
def test_logical_axes_match_params_rank_by_rank(name):
    config = ModelConfig.from_hf(KNOWN_CONFIGS[name])
    shapes = tf.param_shapes(config)
    axes = tf.logical_axes(config)
    is_spec = lambda x: isinstance(x, PartitionSpec)
    assert jax.tree.structure(axes, is_leaf=is_spec) == jax.tree.structure(shapes)
    for spec, x in zip(jax.tree.leaves(axes, is_leaf=is_spec), jax.tree.leaves(shapes), strict=True):
        assert len(spec) == len(x.shape)
        assert set(spec) <= {"embed", "heads", "kv_heads", "head_dim", "mlp", "vocab", "layers"}
    assert axes["layers"]["q"] == PartitionSpec("layers", "embed", "heads", "head_dim")


@pytest.mark.parametrize("name", sorted(KNOWN_CONFIGS))
def test_config_round_trips_through_hf_dict(name):
    config = ModelConfig.from_hf(KNOWN_CONFIGS[name])
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_family_features_are_read_from_config():
    qwen2, llama, qwen3 = (ModelConfig.from_hf(c) for c in (QWEN2_5_7B, LLAMA_3_1_8B, QWEN3_4B))
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm and not qwen2.tie_embeddings
    assert llama.rope_type == "llama3" and llama.rope_factor == 8.0
    assert llama.eos_token_ids == (128001, 128008, 128009)
    assert qwen3.qk_norm and qwen3.tie_embeddings
    assert qwen3.head_dim == 128 != qwen3.hidden_size // qwen3.num_heads


def test_llama3_rope_frequencies_match_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = transformers.LlamaConfig(**LLAMA_3_1_8B)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, torch.device("cpu"))
    ours = tf.rope_inv_freq(ModelConfig.from_hf(LLAMA_3_1_8B))
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)
    plain = tf.rope_inv_freq(dataclasses.replace(ModelConfig.from_hf(LLAMA_3_1_8B), rope_type="default"))
    assert ours[0] == plain[0] and np.isclose(ours[-1], plain[-1] / 8.0)  # high kept, low slowed 8x


def test_invalid_configs_raise_with_valid_choices():
    with pytest.raises(ValueError, match="MistralForCausalLM.*LlamaForCausalLM"):
        ModelConfig.from_hf({**LLAMA_3_1_8B, "architectures": ["MistralForCausalLM"]})
    with pytest.raises(ValueError, match="remat.*'none'"):
        ModelConfig.from_hf(LLAMA_3_1_8B, remat="sometimes")
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        ModelConfig.from_hf({**LLAMA_3_1_8B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="sliding-window"):
        ModelConfig.from_hf({**QWEN2_5_7B, "use_sliding_window": True})


@pytest.mark.parametrize("n_in", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_projection_backward_equals_autodiff_of_einsum(n_in, dtype):
    """The hand-written backward of the weight projections (`kljax.kernels.cpu.matmul.matmul`) is the
    gradient of the plain einsum, for one and for two contracted axes (the output projection's [H, Dh])."""
    from kljax.kernels.cpu.matmul import project

    rng = np.random.default_rng(n_in)
    x = jnp.asarray(rng.standard_normal((3, 5, 24) if n_in == 1 else (3, 5, 4, 6)), dtype)
    w = jnp.asarray(rng.standard_normal(x.shape[-n_in:] + (7,)), dtype)
    spec = "btd,do->bto" if n_in == 1 else "bthk,hko->bto"
    cot = jnp.asarray(rng.standard_normal(x.shape[:-n_in] + (7,)), jnp.float32)

    def loss(f):
        return lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * cot)

    ours = jax.grad(loss(lambda x, w: project(x, w, n_in)), argnums=(0, 1))(x, w)
    ref = jax.grad(loss(lambda x, w: jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(x.dtype)),
                   argnums=(0, 1))(x, w)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(project(x, w, n_in), np.float32),
                               np.asarray(jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(x.dtype),
                                          np.float32), rtol=tol, atol=tol)
