"""The sampler on the embedded SmolLM2-135M-Instruct: greedy equals transformers' generate."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kljax.sampling import SamplingParams, generate, left_pad, response_logprobs  # noqa: E402

PROMPTS = (
    "What is 7 times 8?",
    "Write one sentence about the sea, please, and make it about waves at night.",
    "Name a prime number.",
    "Hi",
)


@pytest.fixture(scope="session")
def smollm2_sampling():
    """(HF dir, transformers model, tokenizer, kljax params, config), loaded once per session."""
    pytest.importorskip("gguf")
    from kljax.models import default
    from kljax.models.convert import load_hf_checkpoint

    try:
        path = default.default_model_dir()
    except FileNotFoundError as e:
        pytest.skip(f"SmolLM2 not available: {e}")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    params, config = load_hf_checkpoint(path)
    return path, model, tokenizer, params, config


def hf_greedy(model, tokens, mask, new, pad, eos):
    """transformers' greedy generate (one thread: no OpenMP spinning on a busy machine); rows end at
    an EOS and are padded with `pad` after it, as kljax masks them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            out = model.generate(
                input_ids=torch.from_numpy(tokens.astype(np.int64)),
                attention_mask=torch.from_numpy(mask.astype(np.int64)),
                max_new_tokens=new, do_sample=False, pad_token_id=pad, eos_token_id=list(eos),
            )[:, tokens.shape[1]:].numpy()
    finally:
        torch.set_num_threads(threads)
    return np.pad(out, ((0, 0), (0, new - out.shape[1])), constant_values=pad)


def test_greedy_equals_transformers_generate_on_a_left_padded_batch(smollm2_sampling):
    _, model, tokenizer, params, config = smollm2_sampling
    chat = lambda p: list(tokenizer.apply_chat_template(
        [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
    ))
    ids = [chat(p) for p in PROMPTS[:2]] + [tokenizer.encode(p) for p in PROMPTS[2:]]
    assert len({len(i) for i in ids}) == len(ids)  # all lengths differ
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    tokens, mask = left_pad(ids, pad)
    new, eos = 16, config.eos_token_ids
    ref = hf_greedy(model, tokens, mask, new, pad, eos)
    sp = SamplingParams(max_new_tokens=new, greedy=True, stop_token_ids=eos)
    out = generate(params, config, tokens, mask, jax.random.key(0), sp)
    ours = np.asarray(out.response_tokens_rn)
    for r in range(len(PROMPTS)):
        print(repr(tokenizer.decode(ours[r][np.asarray(out.response_mask_rn[r])])))
    np.testing.assert_array_equal(ours, ref)
    assert np.asarray(out.stopped_r).any() and not np.asarray(out.stopped_r).all()  # both cases covered
    # The greedy log-probs are the model's own (temperature 1), as teacher forcing gives them.
    forced = np.asarray(jax.jit(response_logprobs, static_argnames="config")(params, out, config=config))
    np.testing.assert_allclose(np.asarray(out.response_logprobs_rn), forced, atol=1e-4)


def test_sampled_logprobs_equal_teacher_forced_on_smollm2(smollm2_sampling):
    _, _, tokenizer, params, config = smollm2_sampling
    tokens, mask = left_pad([tokenizer.encode(p) for p in PROMPTS[:2]], 0)
    sp = SamplingParams(max_new_tokens=16, temperature=1.0, n=2)
    out = generate(params, config, tokens, mask, jax.random.key(3), sp)
    forced = np.asarray(jax.jit(response_logprobs, static_argnames="config")(params, out, config=config))
    diff = np.abs(forced - np.asarray(out.response_logprobs_rn)).max()
    print(f"SmolLM2 float32: max |sampler - teacher-forced| = {diff:.2e}")
    assert diff < 1e-4
