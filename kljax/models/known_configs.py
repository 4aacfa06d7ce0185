"""HF config.json dicts of full-size models, for shape-only work (eval_shape, AOT memory plans).

No weights: these are the published configurations, written out so nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

QWEN2_5_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "sliding_window": 131072,
    "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}

QWEN2_5_0_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "sliding_window": 32768,
    "use_sliding_window": False, "max_window_layers": 24, "tie_word_embeddings": True,
    "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
}

QWEN2_5_1_5B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
    "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
    "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "sliding_window": 131072,
    "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": True,
    "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
}

LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}

QWEN3_4B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None, "attention_bias": False,
    "sliding_window": None, "use_sliding_window": False, "max_window_layers": 36,
    "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}

SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": QWEN2_5_0_5B,
    "qwen2.5-1.5b": QWEN2_5_1_5B,
    "qwen2.5-7b": QWEN2_5_7B,
    "llama-3.1-8b": LLAMA_3_1_8B,
    "qwen3-4b": QWEN3_4B,
    "smollm2-135m": SMOLLM2_135M,
}
