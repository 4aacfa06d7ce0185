"""The sampler in chunks (`SamplingParams.chunk`): the same greedy tokens and log-probs as one batch,
row for row, under the plain and the CPU kernels and on a sharded mesh; bad chunks are refused."""

import dataclasses

import jax
import numpy as np
import pytest
from prompt_batches import left_padded_prompts

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as sharding_lib
from kljax.sampling import SamplingParams, generate, response_logprobs
from kljax.sampling.chunks import num_chunks

CONFIG = ModelConfig(architecture="LlamaForCausalLM", vocab_size=61, hidden_size=32, intermediate_size=64,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                     tie_embeddings=False, eos_token_ids=(3,), pad_token_id=0)


def prompts(b: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return left_padded_prompts(b, CONFIG.vocab_size, 4, seed)


def fields(result) -> dict[str, np.ndarray]:
    return {f.name: np.asarray(getattr(result, f.name)) for f in dataclasses.fields(result)
            if getattr(result, f.name) is not None}


@pytest.mark.parametrize("kernels", ["plain", "cpu"])
def test_chunked_greedy_sampler_equals_one_batch(kernels):
    config = dataclasses.replace(CONFIG, kernels=kernels)
    params = tfm.init_params(config, jax.random.key(0), std=0.3)
    tokens, mask = prompts(8)
    sp = SamplingParams(max_new_tokens=12, greedy=True, n=2, stop_token_ids=(3,), entropy=True)
    whole = fields(generate(params, config, tokens, mask, jax.random.key(1), sp))
    for chunk in (1, 2, 4):
        chunk_sp = dataclasses.replace(sp, chunk=chunk)
        chunked = fields(generate(params, config, tokens, mask, jax.random.key(1), chunk_sp))
        assert chunked.keys() == whole.keys()
        for name, value in whole.items():
            if value.dtype.kind == "f":
                np.testing.assert_allclose(chunked[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(chunked[name], value, err_msg=name)
    assert whole["response_mask_rn"].sum() > 8 and (whole["response_logprobs_rn"] < 0).any()


def test_chunked_sampler_on_a_mesh_equals_one_batch():
    mesh = sharding_lib.make_mesh(data=1, fsdp=4, tensor=2)
    config = dataclasses.replace(CONFIG, kernels="plain")
    params = tfm.init_params(config, jax.random.key(2), std=0.3)
    tokens, mask = prompts(16, seed=3)
    sp = SamplingParams(max_new_tokens=10, greedy=True, n=3)
    whole = generate(params, config, tokens, mask, jax.random.key(0), sp, mesh=mesh)
    chunked = generate(params, config, tokens, mask, jax.random.key(0), dataclasses.replace(sp, chunk=4), mesh=mesh)
    np.testing.assert_array_equal(np.asarray(chunked.response_tokens_rn), np.asarray(whole.response_tokens_rn))
    np.testing.assert_allclose(np.asarray(chunked.response_logprobs_rn), np.asarray(whole.response_logprobs_rn),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="sampler chunk of 2 prompts does not divide over the mesh's data axes"):
        generate(params, config, tokens, mask, jax.random.key(0), dataclasses.replace(sp, chunk=2), mesh=mesh)


def test_sampled_chunks_draw_from_the_same_distribution():
    """Sampling (not greedy): each chunk draws with its own key, so tokens differ, but every log-prob
    is the one of the token drawn (the same row-wise function of the prefix as in one batch)."""
    config = dataclasses.replace(CONFIG, kernels="plain")
    params = tfm.init_params(config, jax.random.key(4), std=0.3)
    tokens, mask = prompts(8, seed=5)
    sp = SamplingParams(max_new_tokens=8, n=2, chunk=2)
    out = generate(params, config, tokens, mask, jax.random.key(0), sp)
    teacher = response_logprobs(params, out, config=config)
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), np.asarray(teacher), rtol=1e-4, atol=1e-5)


def test_num_chunks():
    assert num_chunks(64, 0) == 1 and num_chunks(64, 64) == 1 and num_chunks(64, 100) == 1
    assert num_chunks(64, 16) == 4 and num_chunks(64, 1) == 64
    with pytest.raises(ValueError, match="sampler chunk of 24 prompts does not divide the batch of 64 prompts"):
        num_chunks(64, 24)
    with pytest.raises(ValueError, match="chunk"):
        SamplingParams(chunk=-1)
