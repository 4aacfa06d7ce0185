"""The jitted sampler on tiny random models: distributions, log-probs, masks, n samples, buckets."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

from kljax import sampling  # noqa: E402
from kljax.models import transformer as tf  # noqa: E402
from kljax.models.convert import load_hf_checkpoint  # noqa: E402
from kljax.models.tiny import TINY_FAMILIES, save_tiny_hf_model  # noqa: E402
from kljax.parallel import sharding as sharding_lib  # noqa: E402
from kljax.sampling import (  # noqa: E402
    SamplingParams,
    bucket_length,
    generate,
    response_logprobs,
    sampler,  # noqa: E402
)
from kljax.sampling import logits as sampling_logits  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """family -> (params, config, HF dir) of the tiny random models, built once."""
    out = {}
    for family in sorted(TINY_FAMILIES):
        path = save_tiny_hf_model(family, tmp_path_factory.mktemp(f"sampling_{family}"))
        params, config = load_hf_checkpoint(path)
        out[family] = (params, config, path)
    return out


@pytest.fixture(scope="session")
def tiny(tiny_models):
    params, config, _ = tiny_models["llama_tied"]
    return params, config


def prompts(vocab: int, lengths=(3, 7, 5, 1), seed: int = 0, width: int | None = None):
    """Left-padded tokens [B, P] and mask [B, P] with the given prompt lengths (pad id 0)."""
    rng = np.random.default_rng(seed)
    width = width or max(lengths)
    tokens = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), bool)
    for b, n in enumerate(lengths):
        tokens[b, width - n:] = rng.integers(1, vocab, n)
        mask[b, width - n:] = True
    return tokens, mask


def last_logits(params, config, tokens, mask):
    """Float32 logits [B, V] after each left-padded prompt, by the plain forward."""
    return np.asarray(jax.jit(tf.apply, static_argnames="config")(params, tokens, mask, config=config))[:, -1]


# ---------------------------------------------------------------------------------------- params


def test_bucket_length():
    assert [bucket_length(n, (16, 64)) for n in (1, 16, 17, 64, 65, 130)] == [16, 16, 64, 64, 128, 192]
    assert bucket_length(5, ()) == 5
    with pytest.raises(ValueError, match="n >= 1"):
        bucket_length(0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(n=0), "n \\(samples per prompt\\)"),
        (dict(stop_token_ids=(-3,)), "stop_token_ids"),
    ],
)
def test_bad_sampling_params_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_are_hashable_and_normalized():
    a = SamplingParams(stop_token_ids=[7, 3, 7], max_new_tokens=8)
    b = SamplingParams(stop_token_ids=(3, 7), max_new_tokens=8)
    assert a == b and hash(a) == hash(b) and a.stop_token_ids == (3, 7)
    assert SamplingParams(temperature=0.0).is_greedy and not SamplingParams().is_greedy


def test_bad_requests_raise(tiny):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size)
    key = jax.random.key(0)
    mask_empty = mask.copy()
    mask_empty[2] = False
    with pytest.raises(ValueError, match="empty prompt .* row\\(s\\) \\[2\\]"):
        generate(params, config, tokens, mask_empty, key, SamplingParams(max_new_tokens=4))
    too_long = config.max_position_embeddings  # + a 7-token prompt exceeds the context
    with pytest.raises(ValueError, match="exceeds the model's context"):
        generate(params, config, tokens, mask, key, SamplingParams(max_new_tokens=too_long))
    holes = mask.copy()
    holes[1, 3] = False
    with pytest.raises(ValueError, match="contiguous"):
        generate(params, config, tokens, holes, key, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="prompt token ids"):
        generate(params, config, tokens + config.vocab_size, mask, key, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="non-empty \\[B, P\\]"):
        generate(params, config, tokens[0], mask[0], key, SamplingParams(max_new_tokens=4))
    mesh = sharding_lib.make_mesh(data=-1, fsdp=1)
    with pytest.raises(ValueError, match="does not divide"):
        generate(params, config, tokens[:3], mask[:3], key, SamplingParams(max_new_tokens=4), mesh=mesh)


# ---------------------------------------------------------------------------------------- distribution


def test_first_token_distribution_matches_softmax_of_logits_over_temperature(tiny):
    """Chi-square test of 6000 draws of one token against softmax(logits / T)."""
    params, config = tiny
    tokens, mask = prompts(config.vocab_size, lengths=(6,), seed=3)
    temperature, n = 1.7, 6000
    sp = SamplingParams(max_new_tokens=1, temperature=temperature, n=n)
    out = generate(params, config, tokens, mask, jax.random.key(11), sp)
    drawn = np.asarray(out.response_tokens_rn[:, 0])
    probs = np.asarray(jax.nn.softmax(last_logits(params, config, tokens, mask)[0] / temperature), np.float64)
    probs /= probs.sum()
    counts = np.bincount(drawn, minlength=config.vocab_size)
    expected = probs * n
    big = expected >= 5  # pool the rare tokens into one bin
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    stat, p_value = scipy_stats.chisquare(obs, exp)
    print(f"chi2={stat:.1f} over {len(obs)} bins, p={p_value:.3f}")
    assert big.sum() > 20 and p_value > 1e-3
    # The sampler's log-probs are those of this distribution.
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn[:, 0]), np.log(probs[drawn]), atol=1e-5)


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.6), (12, 0.5)])
def test_top_k_top_p_never_emit_excluded_tokens(tiny, top_k, top_p):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size, lengths=(4, 9), seed=5)
    temperature, n = 2.0, 1500
    sp = SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, n=n)
    out = generate(params, config, tokens, mask, jax.random.key(2), sp)
    logits = last_logits(params, config, tokens, mask) / temperature
    for b in range(2):
        order = np.argsort(-logits[b], kind="stable")
        probs = np.asarray(jax.nn.softmax(logits[b][order[: top_k or None]]))
        keep = np.cumsum(probs) - probs < top_p
        allowed = order[: len(probs)][keep]
        drawn = np.asarray(out.response_tokens_rn[b * n: (b + 1) * n, 0])
        assert set(drawn.tolist()) <= set(allowed.tolist())
        assert len(set(drawn.tolist())) == len(allowed)  # and every allowed token shows up
        renorm = probs[keep] / probs[keep].sum()
        logq = dict(zip(allowed.tolist(), np.log(renorm), strict=True))
        want = np.array([logq[t] for t in drawn])
        np.testing.assert_allclose(np.asarray(out.response_logprobs_rn[b * n: (b + 1) * n, 0]), want, atol=1e-5)


def test_sampling_is_reproducible_with_a_fixed_key(tiny):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size)
    sp = SamplingParams(max_new_tokens=10, temperature=1.0)
    a = generate(params, config, tokens, mask, jax.random.key(7), sp)
    b = generate(params, config, tokens, mask, jax.random.key(7), sp)
    c = generate(params, config, tokens, mask, jax.random.key(8), sp)
    np.testing.assert_array_equal(a.response_tokens_rn, b.response_tokens_rn)
    np.testing.assert_array_equal(a.response_logprobs_rn, b.response_logprobs_rn)
    assert (np.asarray(a.response_tokens_rn) != np.asarray(c.response_tokens_rn)).any()


# ---------------------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_sampler_logprobs_equal_teacher_forced_logprobs(tiny_models, family):
    params, config, _ = tiny_models[family]
    tokens, mask = prompts(config.vocab_size, lengths=(5, 11, 2))
    sp = SamplingParams(max_new_tokens=40, temperature=1.0, n=2)
    out = generate(params, config, tokens, mask, jax.random.key(1), sp)
    forced = np.asarray(jax.jit(response_logprobs, static_argnames="config")(params, out, config=config))
    diff = np.abs(forced - np.asarray(out.response_logprobs_rn)).max()
    print(f"{family}: max |sampler - teacher-forced| = {diff:.2e}")
    assert diff < 1e-4
    assert np.asarray(out.response_mask_rn).all()  # no stop ids: every token counts


def test_tempered_and_truncated_logprobs_equal_teacher_forced_ones(tiny):
    """At T != 1 with top-k/top-p the sampler's log-probs are those of the renormalized tempered
    distribution, recomputed here from a teacher-forced forward pass."""
    params, config = tiny
    tokens, mask = prompts(config.vocab_size, lengths=(5, 8))
    for sp in (
        SamplingParams(max_new_tokens=24, temperature=0.6),
        SamplingParams(max_new_tokens=24, temperature=1.3, top_k=7, top_p=0.8),
        SamplingParams(max_new_tokens=24, temperature=1.3, top_p=0.7),
    ):
        out = generate(params, config, tokens, mask, jax.random.key(4), sp)
        logits = jax.jit(tf.apply, static_argnames="config")(
            params, out.sequence_tokens_rs, out.sequence_mask_rs, out.sequence_positions_rs, config=config
        )
        p, (r, n) = out.prompt_length, out.response_tokens_rn.shape
        step_logits = logits[:, p - 1: p - 1 + n].reshape(r * n, -1)
        want = jax.jit(sampling.sampling_logprobs, static_argnums=2)(
            step_logits, out.response_tokens_rn.reshape(-1), sp
        )
        np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), np.asarray(want).reshape(r, n), atol=1e-4)
        if sp.top_k == 0 and sp.top_p == 1.0:
            forced = response_logprobs(params, out, config=config, temperature=sp.temperature)
            np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), np.asarray(forced), atol=1e-4)


@pytest.mark.parametrize("sp", [
    SamplingParams(max_new_tokens=16, temperature=0.7, top_k=5),
    SamplingParams(max_new_tokens=16, temperature=1.2, top_p=0.6),
    SamplingParams(max_new_tokens=16, greedy=True),
], ids=["top_k", "top_p", "greedy"])
def test_sampling_entropy_is_the_entropy_of_the_distribution_sampled_from(tiny, sp):
    """-sum q log q over the renormalized candidates, q from `sampling_logprobs` of every token
    (greedy: the model's temperature-1 distribution); excluded tokens carry no mass."""
    params, config = tiny
    tokens, mask = prompts(config.vocab_size, lengths=(4, 6, 2))
    logits_rv = jnp.asarray(last_logits(params, config, tokens, mask))
    r, v = logits_rv.shape
    every_rv = jnp.broadcast_to(jnp.arange(v), (r, v))
    logq_rv = jax.vmap(lambda t: sampling.sampling_logprobs(logits_rv, t, sp), in_axes=1, out_axes=1)(every_rv)
    q_rv = np.exp(np.asarray(logq_rv, np.float64))
    np.testing.assert_allclose(q_rv.sum(-1), 1.0, atol=1e-5)
    want = -np.sum(np.where(q_rv > 0, q_rv * np.log(np.where(q_rv > 0, q_rv, 1.0)), 0.0), axis=-1)
    got = np.asarray(sampling.sampling_entropy(logits_rv, sp))
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("family", ["llama_tied", "qwen3"])
def test_sampler_entropy_equals_teacher_forced_entropy(tiny_models, family):
    """With `entropy=True` the sampler returns each step's entropy, which at temperature 1 equals the
    trainer's teacher-forced entropy (`token_logprobs(with_entropy=True)`); 0 after a stop; None
    when not asked for, and the tokens and log-probs are the same either way."""
    params, config, _ = tiny_models[family]
    tokens, mask = prompts(config.vocab_size, lengths=(5, 9, 3))
    plain = generate(params, config, tokens, mask, jax.random.key(2), SamplingParams(max_new_tokens=20, n=2))
    stop = int(np.asarray(plain.response_tokens_rn)[1, 6])
    sp = SamplingParams(max_new_tokens=20, n=2, stop_token_ids=(stop,))
    without = generate(params, config, tokens, mask, jax.random.key(2), sp)
    out = generate(params, config, tokens, mask, jax.random.key(2), dataclasses.replace(sp, entropy=True))
    assert without.response_entropy_rn is None
    np.testing.assert_array_equal(out.response_tokens_rn, without.response_tokens_rn)
    np.testing.assert_array_equal(out.response_logprobs_rn, without.response_logprobs_rn)
    seq = out.sequence_tokens_rs
    _, entropy_rs = jax.jit(tf.token_logprobs, static_argnames=("config", "with_entropy"))(
        params, seq, out.sequence_mask_rs, out.sequence_positions_rs, jnp.roll(seq, -1, axis=1),
        config=config, with_entropy=True,
    )
    p, n = out.prompt_length, out.response_tokens_rn.shape[1]
    response_mask = np.asarray(out.response_mask_rn)
    want = np.where(response_mask, np.asarray(entropy_rs)[:, p - 1: p - 1 + n], 0.0)
    got = np.asarray(out.response_entropy_rn)
    assert not response_mask.all() and (got[~response_mask] == 0).all()  # the stop masked something
    assert (got[response_mask] > 0).all()
    np.testing.assert_allclose(got, want, atol=1e-4)


# ---------------------------------------------------------------------------------------- stops, masks


def test_masks_after_stop_tokens(tiny):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size, lengths=(3, 7, 5, 1, 4, 6))
    free = generate(params, config, tokens, mask, jax.random.key(0), SamplingParams(max_new_tokens=12, greedy=True))
    free_tokens = np.asarray(free.response_tokens_rn)
    # Stop ids: what row 0 emits at step 4 and row 1 at step 0 (rows may hit them elsewhere too).
    stops = (int(free_tokens[0, 4]), int(free_tokens[1, 0]))
    sp = SamplingParams(max_new_tokens=12, greedy=True, stop_token_ids=stops)
    out = generate(params, config, tokens, mask, jax.random.key(0), sp)
    got, got_mask = np.asarray(out.response_tokens_rn), np.asarray(out.response_mask_rn)
    logp = np.asarray(out.response_logprobs_rn)
    for r in range(len(tokens)):
        hits = np.flatnonzero(np.isin(free_tokens[r], stops))
        length = hits[0] + 1 if len(hits) else 12
        assert out.response_lengths_r[r] == length and bool(out.stopped_r[r]) == bool(len(hits))
        np.testing.assert_array_equal(got_mask[r], np.arange(12) < length)
        np.testing.assert_array_equal(got[r, :length], free_tokens[r, :length])  # stop token kept
        assert (got[r, length:] == 0).all() and (logp[r, length:] == 0).all()
        np.testing.assert_array_equal(out.sequence_mask_rs[r, out.prompt_length:], got_mask[r])
    assert int(out.response_lengths_r[0]) <= 5 and int(out.response_lengths_r[1]) == 1


def test_loop_stops_early_when_every_row_is_done(tiny):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size)
    sp = SamplingParams(max_new_tokens=30, stop_token_ids=tuple(range(config.vocab_size)))
    out = generate(params, config, tokens, mask, jax.random.key(0), sp)
    assert int(out.num_steps) == 1
    assert (np.asarray(out.response_lengths_r) == 1).all() and np.asarray(out.stopped_r).all()


# ---------------------------------------------------------------------------------------- n, padding


def test_n_samples_share_one_prefill_and_equal_the_repeated_prompts(tiny, monkeypatch):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size)
    seen = []
    real_prefill = sampler.prefill

    def spy(params, tokens_bp, *args, **kwargs):
        seen.append(tokens_bp.shape)
        return real_prefill(params, tokens_bp, *args, **kwargs)

    monkeypatch.setattr(sampler, "prefill", spy)
    sp = SamplingParams(max_new_tokens=9, temperature=1.1, n=3)
    many = generate(params, config, tokens, mask, jax.random.key(5), sp)
    assert seen == [(4, 16)]  # traced once, over the 4 prompts, not 12 rows
    one = generate(
        params, config, np.repeat(tokens, 3, 0), np.repeat(mask, 3, 0), jax.random.key(5),
        dataclasses.replace(sp, n=1),
    )
    np.testing.assert_array_equal(many.response_tokens_rn, one.response_tokens_rn)
    np.testing.assert_allclose(many.response_logprobs_rn, one.response_logprobs_rn, atol=1e-5)
    np.testing.assert_array_equal(many.sequence_tokens_rs, one.sequence_tokens_rs)
    assert many.response_tokens_rn.shape == (12, 9)


def test_greedy_first_row_is_greedy_and_the_others_are_the_plain_draws(tiny):
    """greedy_first: row 0 of each prompt's n is the greedy decode (tokens and temperature-1 log-probs),
    rows 1..n-1 are exactly the rows the same call without it draws (an evaluation's greedy and
    sampled answers from one prefill)."""
    params, config = tiny
    tokens, mask = prompts(config.vocab_size)
    sp = SamplingParams(max_new_tokens=7, temperature=1.3, n=3)
    mixed = generate(params, config, tokens, mask, jax.random.key(2), dataclasses.replace(sp, greedy_first=True))
    drawn = generate(params, config, tokens, mask, jax.random.key(2), sp)
    greedy = generate(params, config, tokens, mask, jax.random.key(9), SamplingParams(max_new_tokens=7, greedy=True))
    rows = np.arange(12)
    np.testing.assert_array_equal(np.asarray(mixed.response_tokens_rn)[rows % 3 != 0],
                                  np.asarray(drawn.response_tokens_rn)[rows % 3 != 0])
    np.testing.assert_array_equal(np.asarray(mixed.response_tokens_rn)[rows % 3 == 0], greedy.response_tokens_rn)
    np.testing.assert_allclose(np.asarray(mixed.response_logprobs_rn)[rows % 3 == 0], greedy.response_logprobs_rn,
                               atol=1e-5)
    assert not np.array_equal(np.asarray(drawn.response_tokens_rn)[rows % 3 == 0], greedy.response_tokens_rn)


def test_right_padded_prompts_give_the_same_samples(tiny):
    params, config = tiny
    tokens, mask = prompts(config.vocab_size)
    right_tokens = np.zeros_like(tokens)
    right_mask = np.zeros_like(mask)
    for b in range(len(tokens)):
        n = mask[b].sum()
        right_tokens[b, :n] = tokens[b, mask[b]]
        right_mask[b, :n] = True
    sp = SamplingParams(max_new_tokens=6, temperature=1.0)
    left = generate(params, config, tokens, mask, jax.random.key(3), sp)
    right = generate(params, config, right_tokens, right_mask, jax.random.key(3), sp)
    np.testing.assert_array_equal(left.response_tokens_rn, right.response_tokens_rn)
    np.testing.assert_array_equal(left.sequence_tokens_rs, right.sequence_tokens_rs)


def test_one_compile_for_two_batches_in_one_bucket(tiny):
    params, config = tiny
    sp = SamplingParams(max_new_tokens=5, temperature=0.9, top_k=20)  # params no other test uses
    before = sampling.compile_count()
    for lengths in ((3, 9, 2), (12, 1, 7)):  # longest 9 and 12: both in the 16 bucket
        tokens, mask = prompts(config.vocab_size, lengths=lengths, width=13)
        out = generate(params, config, tokens, mask, jax.random.key(0), sp)
        assert out.prompt_length == 16
    assert sampling.compile_count() == before + 1
    tokens, mask = prompts(config.vocab_size, lengths=(20, 3, 3))  # next bucket: a second program
    generate(params, config, tokens, mask, jax.random.key(0), sp)
    assert sampling.compile_count() == before + 2


# ---------------------------------------------------------------------------------------- sharding


def test_sharded_run_gives_the_same_tokens_as_unsharded(tiny_models):
    _, config, path = tiny_models["qwen3"]
    assert len(jax.devices()) == 8
    params, _ = load_hf_checkpoint(path)
    tokens, mask = prompts(config.vocab_size, lengths=(3, 7, 5, 1, 2, 8, 4, 6))
    mesh = sharding_lib.make_mesh(data=2, fsdp=2, tensor=2)
    sharded_params, _ = load_hf_checkpoint(path, mesh=mesh)
    for sp in (
        SamplingParams(max_new_tokens=10, greedy=True),
        SamplingParams(max_new_tokens=10, temperature=1.0, n=2),
    ):
        plain = generate(params, config, tokens, mask, jax.random.key(9), sp)
        sharded = generate(sharded_params, config, tokens, mask, jax.random.key(9), sp, mesh=mesh)
        assert len(sharded.response_tokens_rn.sharding.device_set) == 8
        np.testing.assert_array_equal(plain.response_tokens_rn, sharded.response_tokens_rn)
        np.testing.assert_allclose(plain.response_logprobs_rn, sharded.response_logprobs_rn, atol=1e-5)


def test_bfloat16_sampler_agrees_with_the_bfloat16_model(tiny_models):
    """bf16 runs its own code paths (cache updates through the bits, row-major o projection)."""
    _, _, path = tiny_models["llama_tied"]
    params, config = load_hf_checkpoint(path, param_dtype="bfloat16", dtype="bfloat16")
    tokens, mask = prompts(config.vocab_size, lengths=(5, 11))
    out = generate(params, config, tokens, mask, jax.random.key(1), SamplingParams(max_new_tokens=12, n=2))
    forced = np.asarray(response_logprobs(params, out, config=config))
    diff = np.abs(forced - np.asarray(out.response_logprobs_rn)).max()
    print(f"bfloat16: max |sampler - teacher-forced| = {diff:.2e}")
    assert diff < 0.1
    greedy = generate(params, config, tokens, mask, jax.random.key(1), SamplingParams(max_new_tokens=1, greedy=True))
    np.testing.assert_array_equal(greedy.response_tokens_rn[:, 0], last_logits(params, config, tokens, mask).argmax(-1))


@pytest.mark.parametrize("v", [7, 512, 513, 49152, 50001, 300000])
def test_chunked_argmax_is_the_first_argmax(v):
    """The greedy sampler's two-level argmax equals numpy's (first index on ties) and the max,
    with ties planted across and within chunks, for vocabularies below, at and past the chunking."""
    rng = np.random.default_rng(v)
    x = rng.standard_normal((6, v)).astype(np.float32)
    x[1, [v // 3, v - 1]] = 9.0  # a tie across chunks: the first wins
    x[2, :] = 0.0  # all equal: index 0
    x[3, -1] = 50.0  # the last token
    x[4, :] = -np.inf
    x[4, v // 2] = -1.0  # one finite value among -inf
    tokens, best = jax.jit(sampling_logits._chunked_argmax)(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(tokens), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(best), np.max(x, axis=-1))
