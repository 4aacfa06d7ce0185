"""Tiny random HF models of each family: kljax == transformers, and the model's own identities."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kljax.models import transformer as tf  # noqa: E402
from kljax.models.convert import export_hf, load_hf_checkpoint, read_hf_config  # noqa: E402
from kljax.models.tiny import TINY_FAMILIES, save_tiny_hf_model  # noqa: E402
from kljax.studies.parity import transformers_logits  # noqa: E402

FAMILIES = sorted(TINY_FAMILIES)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> (HF dir, transformers model, kljax params, kljax config)."""
    out = {}
    for family in FAMILIES:
        path = save_tiny_hf_model(family, tmp_path_factory.mktemp(family))
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        params, config = load_hf_checkpoint(path)
        out[family] = (path, model, params, config)
    return out


def padded_batch(vocab: int, seed: int = 0, t: int = 13, pads=(0, 4, 9)):
    """tokens [B, T], mask [B, T] with left padding (pad id 0)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, (len(pads), t)).astype(np.int32)
    mask = np.ones_like(tokens, bool)
    for b, p in enumerate(pads):
        mask[b, :p] = False
        tokens[b, :p] = 0
    return tokens, mask


# Jitted once per (config, shape): tests reuse the (3, 13) batch so each family compiles rarely.
apply_jit = jax.jit(tf.apply, static_argnames="config")
logprobs_jit = jax.jit(tf.token_logprobs, static_argnames=("config", "chunk_size", "with_entropy"))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_on_left_padded_batch(tiny, family):
    _, model, params, config = tiny[family]
    tokens, mask = padded_batch(config.vocab_size)
    ours = np.asarray(apply_jit(params, tokens, mask, config=config))
    ref = transformers_logits(model, tokens, mask)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    diff = np.abs(ours - ref)[mask].max()
    print(f"{family}: max_abs_diff={diff:.3e}")
    assert diff < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padding_does_not_change_valid_logits(tiny, family):
    _, _, params, config = tiny[family]
    tokens, mask = padded_batch(config.vocab_size)  # row 1 has 4 pads, then 9 tokens
    tokens[1, 4:] = tokens[0, :9]
    out = np.asarray(apply_jit(params, tokens, mask, config=config))
    np.testing.assert_allclose(out[1, 4:], out[0, :9], atol=2e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_logprobs_and_entropy_equal_full_log_softmax(tiny, family):
    _, _, params, config = tiny[family]
    tokens, mask = padded_batch(config.vocab_size)
    targets = np.roll(tokens, -1, axis=1)
    logp_full = jax.nn.log_softmax(apply_jit(params, tokens, mask, config=config), axis=-1)
    want = np.take_along_axis(np.asarray(logp_full), targets[..., None], -1)[..., 0]
    want_entropy = -np.sum(np.exp(logp_full) * logp_full, axis=-1)
    chunks = (4, 64) if family == "qwen3" else (4,)  # 4 does not divide T=13; 64 > T
    for chunk in chunks:
        logp, entropy = logprobs_jit(
            params, tokens, mask, None, targets, config=config, chunk_size=chunk, with_entropy=True
        )
        assert logp.shape == tokens.shape and logp.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(logp), want, atol=1e-5)
        np.testing.assert_allclose(np.asarray(entropy), want_entropy, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_scan_over_layers_equals_unrolled(tiny, family):
    _, _, params, config = tiny[family]
    tokens, mask = padded_batch(config.vocab_size)
    scanned = apply_jit(params, tokens, mask, config=config)
    unrolled = apply_jit(params, tokens, mask, config=dataclasses.replace(config, scan_layers=False))
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(unrolled), atol=1e-5)


def test_gradients_agree_across_chunking_scan_and_remat(tiny):
    """grad of sum(mask * log p(next token)): chunked + scan + no remat == full log_softmax +
    unrolled + full remat == chunked + scan + dots remat."""
    _, _, params, config = tiny["qwen3"]
    tokens, mask = padded_batch(config.vocab_size)
    targets = np.roll(tokens, -1, axis=1)
    weight = mask.astype(np.float32)

    def chunked(p, cfg):
        return jnp.sum(tf.token_logprobs(p, tokens, mask, None, targets, config=cfg, chunk_size=4) * weight)

    def full(p, cfg):
        logp = jax.nn.log_softmax(tf.apply(p, tokens, mask, config=cfg), axis=-1)
        return jnp.sum(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * weight)

    grad = lambda f, cfg: jax.jit(jax.grad(f), static_argnums=1)(params, cfg)
    base = grad(chunked, config)
    others = [
        grad(full, dataclasses.replace(config, scan_layers=False, remat="full")),
        grad(chunked, dataclasses.replace(config, remat="dots_no_batch_saveable")),
    ]
    for other in others:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), other, base)


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_cache_prefill_then_decode_equals_full_forward(tiny, family):
    _, _, params, config = tiny[family]
    tokens, mask = padded_batch(config.vocab_size, t=11, pads=(0, 3, 6))
    positions = tf.positions_from_mask(mask)
    full = np.asarray(apply_jit(params, tokens, mask, config=config))
    prefill = 7
    step = jax.jit(lambda p, t, m, q, c, i: tf.apply_with_cache(p, t, m, q, c, i, config=config))
    cache = tf.init_cache(config, tokens.shape[0], 16)
    logits, cache = step(params, tokens[:, :prefill], mask[:, :prefill], positions[:, :prefill], cache, 0)
    pieces = [np.asarray(logits)]
    for i in range(prefill, tokens.shape[1]):
        sl = slice(i, i + 1)
        logits, cache = step(params, tokens[:, sl], mask[:, sl], positions[:, sl], cache, i)
        pieces.append(np.asarray(logits))
    cached = np.concatenate(pieces, axis=1)
    np.testing.assert_allclose(cached[mask], full[mask], atol=2e-5)
    assert cache.k.shape == (config.num_layers, 3, 16, config.num_kv_heads, config.head_dim)
    np.testing.assert_array_equal(np.asarray(cache.mask)[:, : tokens.shape[1]], mask)
    assert not np.asarray(cache.mask)[:, tokens.shape[1]:].any()


@pytest.mark.parametrize("family", FAMILIES)
def test_export_reimport_is_exact_and_loads_in_transformers(tiny, tmp_path, family):
    path, model, params, config = tiny[family]
    tokens, mask = padded_batch(config.vocab_size)
    ref = transformers_logits(model, tokens, mask)
    for name, hf_config in (("kept", read_hf_config(path)), ("generated", None)):
        out = export_hf(params, config, tmp_path / name, hf_config=hf_config)
        again, config2 = load_hf_checkpoint(out)
        assert config2 == config
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), again, params)
        exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        np.testing.assert_array_equal(transformers_logits(exported, tokens, mask), ref)


def test_bfloat16_compute_gives_float32_logits_close_to_float32(tiny):
    _, _, params, config = tiny["llama3"]
    tokens, mask = padded_batch(config.vocab_size)
    cfg = dataclasses.replace(config, dtype="bfloat16", param_dtype="bfloat16")
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    low = np.asarray(apply_jit(bf16_params, tokens, mask, config=cfg))
    high = np.asarray(apply_jit(params, tokens, mask, config=config))
    assert low.dtype == np.float32
    scale = np.abs(high[mask]).max()
    assert np.abs(low - high)[mask].max() < 0.05 * scale
