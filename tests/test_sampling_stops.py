"""rl.stop and rl.min_p in the sampler: a stop sequence ends a response like a stop token (kept,
masked after, the kept log-probs still the teacher-forced ones); stop strings become ids and id
sequences through the tokenizer; min-p keeps the tokens with p >= min_p * p_max, renormalized."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from kljax import sampling
from kljax.config import RLConfig
from kljax.models import transformer as tf
from kljax.models.config import ModelConfig
from kljax.models.tokenizers import CharTokenizer
from kljax.sampling import SamplingParams, generate, response_logprobs
from kljax.sampling.sampler import sequence_ends_rn
from kljax.sampling.stops import resolve_stops


@pytest.fixture(scope="module")
def tiny():
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=19, hidden_size=32, intermediate_size=64,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                         kernels="plain")
    return tf.init_params(config, jax.random.key(0), std=0.5), config  # a spread-out distribution


def _prompts(lengths=(3, 6, 2, 5)):
    rng = np.random.default_rng(0)
    tokens, mask = np.zeros((len(lengths), 8), np.int32), np.zeros((len(lengths), 8), bool)
    for b, n in enumerate(lengths):
        tokens[b, 8 - n:], mask[b, 8 - n:] = rng.integers(2, 19, n), True
    return tokens, mask


def _first_end(row: np.ndarray, seq: tuple[int, ...]) -> int | None:
    for j in range(len(seq) - 1, len(row)):
        if tuple(row[j - len(seq) + 1: j + 1]) == seq:
            return j
    return None


def test_stop_sequence_ends_the_response_like_a_stop_token(tiny):
    params, config = tiny
    tokens, mask = _prompts()
    free = generate(params, config, tokens, mask, jax.random.key(0), SamplingParams(max_new_tokens=16, n=3))
    free_tokens = np.asarray(free.response_tokens_rn)
    seq = tuple(int(t) for t in free_tokens[0, 4:6])  # row 0 completes it at step 5 (maybe earlier)
    sp = SamplingParams(max_new_tokens=16, n=3, stop_sequences=(seq,))
    out = generate(params, config, tokens, mask, jax.random.key(0), sp)
    got, got_mask = np.asarray(out.response_tokens_rn), np.asarray(out.response_mask_rn)
    logp = np.asarray(out.response_logprobs_rn)
    ended = 0
    for r in range(len(free_tokens)):
        end = _first_end(free_tokens[r], seq)
        length = 16 if end is None else end + 1
        ended += end is not None
        assert int(out.response_lengths_r[r]) == length and bool(out.stopped_r[r]) == (end is not None)
        np.testing.assert_array_equal(got_mask[r], np.arange(16) < length)
        np.testing.assert_array_equal(got[r, :length], free_tokens[r, :length])  # the sequence kept
        np.testing.assert_array_equal(logp[r, :length], np.asarray(free.response_logprobs_rn)[r, :length])
        assert (got[r, length:] == 0).all() and (logp[r, length:] == 0).all()
    assert int(out.response_lengths_r[0]) <= 6 and ended >= 1
    forced = np.asarray(response_logprobs(params, out, config=config))  # teacher-forced, masked alike
    np.testing.assert_allclose(forced, logp, atol=1e-4)


def test_the_loop_ends_when_every_row_completed_a_stop_sequence(tiny):
    params, config = tiny
    tokens, mask = _prompts((4,))
    free = generate(params, config, tokens, mask, jax.random.key(3), SamplingParams(max_new_tokens=20, greedy=True))
    seq = tuple(int(t) for t in np.asarray(free.response_tokens_rn)[0, 2:4])
    out = generate(params, config, tokens, mask, jax.random.key(3),
                   SamplingParams(max_new_tokens=20, greedy=True, stop_sequences=(seq,)))
    assert int(out.num_steps) <= 4 < 20


def test_sequence_ends_marks_the_last_token_of_each_occurrence():
    tokens = np.array([[5, 6, 7, 5, 6], [6, 5, 6, 6, 0]], np.int32)
    got = np.asarray(sequence_ends_rn(tokens, ((5, 6), (7, 5, 6))))
    np.testing.assert_array_equal(got, [[0, 1, 0, 0, 1], [0, 0, 1, 0, 0]])


def test_one_id_stop_sequences_become_stop_tokens_and_bad_ones_raise():
    sp = SamplingParams(stop_token_ids=(1,), stop_sequences=((4,), (2, 3), (2, 3)))
    assert sp.stop_token_ids == (1, 4) and sp.stop_sequences == ((2, 3),)
    with pytest.raises(ValueError, match="stop_sequences"):
        SamplingParams(stop_sequences=((),))
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)


def test_stop_strings_resolve_to_containing_tokens_and_spellings():
    tok = CharTokenizer()  # one id per character: "=:" can only be spelled "=" ":"
    stops = resolve_stops(["=:", "7", 1], tok, tok.vocab_size)
    eq, colon, seven = (tok.encode(c)[0] for c in "=:7")
    assert stops.token_ids == tuple(sorted({1, seven}))
    assert stops.sequences == ((eq, colon),)
    with pytest.raises(ValueError, match="cannot write 'x'"):
        resolve_stops(["x"], tok, tok.vocab_size)
    with pytest.raises(ValueError, match="token id 40"):
        resolve_stops([40], tok, tok.vocab_size)
    with pytest.raises(ValueError, match="empty string"):
        resolve_stops([""], tok, tok.vocab_size)


def test_stop_strings_with_a_bpe_tokenizer_catch_every_spelling():
    transformers = pytest.importorskip("transformers")
    from kljax.models.default import default_model_dir

    try:
        path = default_model_dir()  # converted once and cached, as the SmolLM2 tests do
    except FileNotFoundError as e:
        pytest.skip(f"no default model: {e}")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    stops = resolve_stops(["\n\n"], tok, len(tok))
    newline = tok.encode("\n", add_special_tokens=False)
    assert tuple(newline * 2) in stops.sequences or len(newline) != 1
    for t in tok.encode("\n\n", add_special_tokens=False):  # its own encoding is a stop
        assert t in stops.token_ids or any(t in s for s in stops.sequences)
    assert all("\n\n" in tok.decode([t]) for t in stops.token_ids)


def test_min_p_keeps_tokens_above_min_p_times_the_best_and_renormalizes(tiny):
    params, config = tiny
    tokens, mask = _prompts((4, 7))
    temperature, min_p, n = 1.3, 0.3, 1200
    sp = SamplingParams(max_new_tokens=1, temperature=temperature, min_p=min_p, n=n)
    out = generate(params, config, tokens, mask, jax.random.key(2), sp)
    logits = np.asarray(tf.apply(params, tokens, mask, config=config))[:, -1] / temperature
    for b in range(2):
        probs = np.exp(logits[b] - logits[b].max())
        probs /= probs.sum()
        allowed = np.flatnonzero(probs >= min_p * probs.max())
        assert 1 < len(allowed) < config.vocab_size
        drawn = np.asarray(out.response_tokens_rn[b * n: (b + 1) * n, 0])
        assert set(drawn.tolist()) == set(allowed.tolist())
        logq = np.log(probs / probs[allowed].sum())
        np.testing.assert_allclose(np.asarray(out.response_logprobs_rn[b * n: (b + 1) * n, 0]), logq[drawn],
                                   atol=1e-5)


def test_min_p_log_probs_equal_the_teacher_forced_ones_under_the_same_truncation(tiny):
    params, config = tiny
    tokens, mask = _prompts()
    sp = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=9, min_p=0.1, n=2)
    out = generate(params, config, tokens, mask, jax.random.key(4), sp)
    logits = tf.apply(params, out.sequence_tokens_rs, out.sequence_mask_rs, out.sequence_positions_rs, config=config)
    p, (r, n) = out.prompt_length, out.response_tokens_rn.shape
    want = sampling.sampling_logprobs(logits[:, p - 1: p - 1 + n].reshape(r * n, -1),
                                      out.response_tokens_rn.reshape(-1), sp)
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), np.asarray(want).reshape(r, n), atol=1e-4)


def test_rl_config_takes_stop_and_min_p():
    rl = RLConfig(stop=["\n\n", 2], min_p=0.05)
    assert rl.stop == ("\n\n", 2) and rl.min_p == 0.05
    with pytest.raises(ValueError, match="rl.min_p"):
        RLConfig(min_p=-0.1)
    with pytest.raises(ValueError, match="rl.stop"):
        RLConfig(stop=[1.5])
