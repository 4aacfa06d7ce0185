"""`transformer.frozen_copy`: the frozen reference (and the async sampler's snapshots) kept in the
compute dtype is exact, because every forward casts each parameter to the compute dtype first.

Checked per tiny family (biases, q/k norms, tied and untied heads): teacher-forced logits and the
sampler's tokens and log-probs from the bfloat16 copy equal those from the float32 parameters bit
for bit; the copy has half the bytes, fresh buffers and the same shardings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.models import transformer as tfm
from kljax.models.convert import load_hf_checkpoint
from kljax.models.tiny import TINY_FAMILIES, save_tiny_hf_model
from kljax.parallel import sharding as shd
from kljax.sampling import SamplingParams, generate


@pytest.fixture(scope="module", params=sorted(TINY_FAMILIES))
def bf16_model(request, tmp_path_factory):
    path = save_tiny_hf_model(request.param, tmp_path_factory.mktemp(request.param))
    mesh = shd.make_mesh(1, 4, 2)
    params, config = load_hf_checkpoint(path, mesh=mesh, dtype="bfloat16", param_dtype="float32")
    return params, config


def buffers(tree) -> set[int]:
    return {s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree) for s in x.addressable_shards}


def test_frozen_copy_is_half_size_fresh_and_keeps_shardings(bf16_model):
    params, config = bf16_model
    frozen = tfm.frozen_copy(params, config)
    assert config.jnp_frozen_dtype == jnp.bfloat16
    assert {x.dtype for x in jax.tree.leaves(frozen)} == {jnp.dtype(jnp.bfloat16)}
    assert sum(x.nbytes for x in jax.tree.leaves(frozen)) * 2 == sum(x.nbytes for x in jax.tree.leaves(params))
    assert not buffers(frozen) & buffers(params)
    same = jax.tree.map(lambda a, b: a.sharding.is_equivalent_to(b.sharding, a.ndim), params, frozen)
    assert all(jax.tree.leaves(same))


def test_forward_and_sampler_from_the_copy_equal_float32_params_exactly(bf16_model):
    params, config = bf16_model
    frozen = tfm.frozen_copy(params, config)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, config.vocab_size, (4, 12)).astype(np.int32)
    mask = np.ones_like(tokens, bool)
    mask[1, :5] = False  # a left-padded row
    apply = jax.jit(tfm.apply, static_argnames="config")
    np.testing.assert_array_equal(np.asarray(apply(params, tokens, mask, config=config)),
                                  np.asarray(apply(frozen, tokens, mask, config=config)))
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, n=2)
    key = jax.random.PRNGKey(3)
    a, b = generate(params, config, tokens, mask, key, sp), generate(frozen, config, tokens, mask, key, sp)
    for field in ("response_tokens_rn", "response_mask_rn", "response_logprobs_rn"):
        np.testing.assert_array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field)), field)


def test_float32_compute_keeps_float32_and_copies(tmp_path):
    params, config = load_hf_checkpoint(save_tiny_hf_model("qwen2", tmp_path))
    frozen = tfm.frozen_copy(params, config)
    assert config.jnp_frozen_dtype == jnp.float32
    assert not buffers(frozen) & buffers(params)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), jax.device_get(frozen))
