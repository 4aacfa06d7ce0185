"""The repetition penalty (`SamplingParams.repetition_penalty`): transformers' rule on each row's seen
ids (real prompt tokens, then its own samples), before temperature and truncation; the sampler's
log-probs are those of the penalized distribution, recomputed here by a teacher-forced forward; greedy
takes the penalized argmax; chunks and a mesh change nothing; penalty 1 carries no seen set."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from prompt_batches import left_padded_prompts

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as sharding_lib
from kljax.sampling import SamplingParams, generate, penalize_repeats, response_logprobs, sampler

CONFIG = ModelConfig(architecture="LlamaForCausalLM", vocab_size=61, hidden_size=32, intermediate_size=64,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                     tie_embeddings=False, pad_token_id=0)


def prompts(b: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompts [B, 8] (pad id 0, itself a token the model may sample)."""
    return left_padded_prompts(b, CONFIG.vocab_size, 1, seed)


def model(kernels: str = "plain", seed: int = 0):
    config = dataclasses.replace(CONFIG, kernels=kernels)
    return tfm.init_params(config, jax.random.key(seed), std=0.3), config


def teacher_forced(params, config, out, sp: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(log q [R, N], entropy [R, N]) of the sampled responses, q the penalized, tempered, top-k'd
    distribution at each step, from one forward over prompt + response (numpy, float64)."""
    logits = np.asarray(jax.jit(tfm.apply, static_argnames="config")(
        params, out.sequence_tokens_rs, out.sequence_mask_rs, out.sequence_positions_rs, config=config), np.float64)
    prompt, prompt_mask = np.asarray(out.prompt_tokens_rp), np.asarray(out.prompt_mask_rp)
    response = np.asarray(out.response_tokens_rn)
    p, (r, n) = out.prompt_length, response.shape
    logq, entropy = np.zeros((r, n)), np.zeros((r, n))
    for i in range(r):
        seen = set(prompt[i][prompt_mask[i]].tolist())
        for j in range(n):
            z = logits[i, p - 1 + j].copy()
            hit = np.array(sorted(seen))
            z[hit] = np.where(z[hit] < 0, z[hit] * sp.repetition_penalty, z[hit] / sp.repetition_penalty)
            z /= sp.temperature
            if sp.top_k:
                z[z < np.sort(z)[-sp.top_k]] = -np.inf
            lq = z - z.max() - np.log(np.sum(np.exp(z - z.max())))
            logq[i, j] = lq[response[i, j]]
            q = np.exp(lq)
            entropy[i, j] = -np.sum(np.where(q > 0, q * np.where(q > 0, lq, 0.0), 0.0))
            seen.add(int(response[i, j]))
    return logq, entropy


def has_repeat(row: np.ndarray) -> bool:
    return len(set(row.tolist())) < len(row)


@pytest.mark.parametrize("penalty", [0.1, 0.7, 1.3, 5.0])
def test_penalize_repeats_equals_transformers(penalty):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(int(penalty * 10))
    logits = (3 * rng.standard_normal((6, 37))).astype(np.float32)
    logits[0, :5] = 0.0  # zeros stay zero
    ids = rng.integers(0, 37, (6, 15))
    seen = np.zeros((6, 37), bool)
    seen[np.arange(6)[:, None], ids] = True
    want = transformers.RepetitionPenaltyLogitsProcessor(penalty)(torch.from_numpy(ids), torch.from_numpy(logits))
    got = jax.jit(penalize_repeats, static_argnums=2)(jnp.asarray(logits), jnp.asarray(seen), penalty)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=3e-7, atol=0)  # XLA may divide by 1 / p


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), float("inf"), "x", None])
def test_bad_repetition_penalty_raises(bad):
    with pytest.raises(ValueError, match=f"repetition_penalty must be a finite number > 0 \\(1 = off\\), got {bad!r}"):
        SamplingParams(repetition_penalty=bad)
    assert SamplingParams(repetition_penalty=2).repetition_penalty == 2.0
    assert isinstance(SamplingParams(repetition_penalty=2).repetition_penalty, float)


@pytest.mark.parametrize("sp", [
    SamplingParams(max_new_tokens=14, temperature=0.8, n=2, repetition_penalty=1.8, entropy=True),
    SamplingParams(max_new_tokens=14, temperature=1.2, top_k=9, n=3, repetition_penalty=0.6, chunk=2),
], ids=["temperature", "top_k-chunked"])
def test_sampler_logprobs_are_those_of_the_penalized_distribution(sp):
    """Each row's seen set is its own: rows of one prompt diverge, and the pad id (0) is not seen."""
    params, config = model("cpu")
    tokens, mask = prompts(4)
    out = generate(params, config, tokens, mask, jax.random.key(3), sp)
    assert np.asarray(out.response_mask_rn).all()
    logq, entropy = teacher_forced(params, config, out, sp)
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), logq, atol=1e-4)
    if sp.entropy:
        np.testing.assert_allclose(np.asarray(out.response_entropy_rn), entropy, atol=1e-4)
    plain = teacher_forced(params, config, out, dataclasses.replace(sp, repetition_penalty=1.0))[0]
    assert np.abs(plain - logq).max() > 0.1  # the penalty matters here


def test_greedy_with_a_strong_penalty_never_repeats():
    """Greedy takes the argmax of the penalized logits (no id of the prompt or of the response so far
    while unseen ones have positive logits) and reports the model's own temperature-1 log-probs."""
    params, config = model("cpu")
    tokens, mask = prompts(8, seed=1)
    sp = SamplingParams(max_new_tokens=20, greedy=True, entropy=True)
    free = np.asarray(generate(params, config, tokens, mask, jax.random.key(0), sp).response_tokens_rn)
    assert any(has_repeat(row) for row in free)
    out = generate(params, config, tokens, mask, jax.random.key(0), dataclasses.replace(sp, repetition_penalty=1e6))
    got = np.asarray(out.response_tokens_rn)
    for row, prompt, m in zip(got, tokens, mask, strict=True):
        assert not has_repeat(row) and not set(row.tolist()) & set(prompt[m].tolist())
    forced = response_logprobs(params, out, config=config)
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), np.asarray(forced), atol=1e-4)


def test_penalty_one_is_the_default_and_carries_no_seen_set(monkeypatch):
    params, config = model("cpu")
    tokens, mask = prompts(4)
    carried = []
    real_loop = sampler.step_lib.decode_loop

    def spy(weights, state, *args, **kwargs):
        carried.append(None if state.seen_rv is None else (state.seen_rv.shape, state.seen_rv.dtype))
        return real_loop(weights, state, *args, **kwargs)

    monkeypatch.setattr(sampler.step_lib, "decode_loop", spy)
    sp = SamplingParams(max_new_tokens=10, temperature=0.9, n=2, entropy=True, stop_sequences=((5, 6),))
    default = generate(params, config, tokens, mask, jax.random.key(7), sp)
    one = generate(params, config, tokens, mask, jax.random.key(7), dataclasses.replace(sp, repetition_penalty=1))
    for f in dataclasses.fields(default):
        np.testing.assert_array_equal(np.asarray(getattr(one, f.name)), np.asarray(getattr(default, f.name)))
    generate(params, config, tokens, mask, jax.random.key(7), dataclasses.replace(sp, repetition_penalty=1.5))
    assert carried == [None, ((8, CONFIG.vocab_size), jnp.bool_)]  # 1.0 == default: one compile, no seen set


def test_chunked_sampler_with_the_penalty_equals_one_batch():
    """Greedy (chunks draw with their own keys): the same tokens, masks and log-probs, row for row."""
    params, config = model("cpu", seed=2)
    tokens, mask = prompts(8, seed=2)
    sp = SamplingParams(max_new_tokens=12, greedy=True, n=2, repetition_penalty=1.7, stop_token_ids=(3,))
    whole = generate(params, config, tokens, mask, jax.random.key(1), sp)
    chunked = generate(params, config, tokens, mask, jax.random.key(1), dataclasses.replace(sp, chunk=2))
    for f in dataclasses.fields(whole):
        want, got = getattr(whole, f.name), getattr(chunked, f.name)
        if want is not None:
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6, err_msg=f.name)
    assert np.asarray(whole.response_mask_rn).sum() > 16


def test_sharded_sampler_with_the_penalty_equals_unsharded():
    assert len(jax.devices()) == 8
    mesh = sharding_lib.make_mesh(data=2, fsdp=2, tensor=2)
    params, config = model("plain", seed=4)
    tokens, mask = prompts(8, seed=4)
    sp = SamplingParams(max_new_tokens=10, temperature=1.0, n=2, repetition_penalty=1.5)
    plain = generate(params, config, tokens, mask, jax.random.key(9), sp)
    sharded = generate(params, config, tokens, mask, jax.random.key(9), sp, mesh=mesh)
    assert len(sharded.response_tokens_rn.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded.response_tokens_rn), np.asarray(plain.response_tokens_rn))
    np.testing.assert_allclose(np.asarray(sharded.response_logprobs_rn), np.asarray(plain.response_logprobs_rn),
                               atol=1e-5)
    logq, _ = teacher_forced(params, config, sharded, sp)
    np.testing.assert_allclose(np.asarray(sharded.response_logprobs_rn), logq, atol=1e-4)
