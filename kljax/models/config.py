"""The model configuration: one frozen dataclass, built from a Hugging Face `config.json` dict.

The dataclass is hashable, so it is passed to jitted functions as a static argument. It holds the
architecture (read from the checkpoint) and the run-time choices (dtypes, scan, remat) that the
caller may change with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from kljax.config.sections import DTYPES, KERNELS, REMAT_POLICIES, LoraConfig

# HF architecture name -> HF model_type. The only architectures kljax converts.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# config.json fields transformers defaults per architecture when absent (its LlamaConfig,
# Qwen2Config, Qwen3Config); head_dim absent elsewhere is hidden_size // num_attention_heads.
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"max_position_embeddings": 2048},
    "Qwen2ForCausalLM": {"max_position_embeddings": 32768},
    "Qwen3ForCausalLM": {"max_position_embeddings": 32768, "head_dim": 128},
}
HF_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
ROPE_TYPES = ("default", "linear", "llama3")
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
               "max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer of the Llama / Qwen2 / Qwen3 families.

    Architecture fields come from the checkpoint; `param_dtype`, `dtype` (compute), `scan_layers`
    and `remat` are run-time choices. Logits and log-probs are always float32.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192
    max_position_embeddings: int = 4096
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # Run-time choices.
    param_dtype: str = "float32"
    dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    kernels: str = "auto"  # "plain" JAX, the "cpu" kernels, or "auto": cpu on a CPU backend only
    lora: LoraConfig | None = None  # LoRA adapters (`kljax.models.lora`): None = full fine-tuning

    def __post_init__(self) -> None:
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model {name}={value!r} must be an integer >= 1")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope type {self.rope_type!r}; supported: {list(ROPE_TYPES)}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; valid: {list(REMAT_POLICIES)}")
        if self.kernels not in KERNELS:
            raise ValueError(f"model.kernels={self.kernels!r} is not valid; choose one of {list(KERNELS)}")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {list(DTYPES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def cpu_kernels(self) -> bool:
        """Whether the model runs the XLA-CPU kernels (`kljax.kernels.cpu`) or plain JAX."""
        return self.kernels == "cpu" or (self.kernels == "auto" and jax.default_backend() == "cpu")

    @property
    def model_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def jnp_param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def jnp_frozen_dtype(self) -> jnp.dtype:
        """The dtype of parameters used only in forward passes (`transformer.frozen_copy`): the compute
        dtype when it is narrower than param_dtype, else param_dtype."""
        narrower = self.jnp_dtype.itemsize < self.jnp_param_dtype.itemsize
        return self.jnp_dtype if narrower else self.jnp_param_dtype

    # ------------------------------------------------------------------ HF config.json <-> ModelConfig

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
        """Build from a HF `config.json` dict (transformers 4.x `rope_scaling` or 5.x `rope_parameters`).

        `overrides` sets run-time fields (param_dtype, dtype, scan_layers, remat, kernels, lora). Raises ValueError
        for an unsupported architecture or feature (sliding windows, MLP bias, non-SiLU, rope types
        other than default/linear/llama3).
        """
        archs = list(hf.get("architectures") or [])
        if not archs:
            by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
            if hf.get("model_type") in by_type:
                archs = [by_type[hf["model_type"]]]
        if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {archs or hf.get('model_type')!r}; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        arch = archs[0]
        model_type = SUPPORTED_ARCHITECTURES[arch]
        missing = [k for k in HF_REQUIRED if k not in hf]
        if missing:
            raise ValueError(f"config.json of {arch} lacks the field(s) {missing}")
        bad = [k for k in HF_REQUIRED if isinstance(hf[k], bool) or not isinstance(hf[k], int) or hf[k] < 1]
        if bad:
            values = ", ".join(f"{k}={hf[k]!r}" for k in bad)
            raise ValueError(f"config.json fields must be positive integers: {values}")
        hf = {**HF_DEFAULTS[arch], **{k: v for k, v in hf.items() if v is not None}}
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is implemented")
        if hf.get("mlp_bias"):
            raise ValueError("unsupported: mlp_bias=True")
        if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or []):
            raise ValueError("unsupported: sliding-window attention (use_sliding_window / layer_types)")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        heads = int(hf["num_attention_heads"])
        eos = hf.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        attention_bias = bool(hf.get("attention_bias", False))
        fields = dict(
            architecture=arch,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rope_type=rope_type,
            rope_factor=float(rope.get("factor", 1.0)),
            rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            rope_original_max_positions=int(
                rope.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
            ),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            qk_norm=model_type == "qwen3",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=hf.get("pad_token_id"),
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self, dtype: str | None = None) -> dict[str, Any]:
        """The HF `config.json` dict for this model (rope in the 4.x form, which 5.x also reads)."""
        rope_scaling: dict[str, Any] | None = None
        if self.rope_type == "linear":
            rope_scaling = {"rope_type": "linear", "factor": self.rope_factor}
        elif self.rope_type == "llama3":
            rope_scaling = {
                "rope_type": "llama3",
                "factor": self.rope_factor,
                "low_freq_factor": self.rope_low_freq_factor,
                "high_freq_factor": self.rope_high_freq_factor,
                "original_max_position_embeddings": self.rope_original_max_positions,
            }
        eos: int | list[int] | None = list(self.eos_token_ids) or None
        if eos is not None and len(eos) == 1:
            eos = eos[0]
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": dtype or self.param_dtype,
        }
        if self.model_type != "qwen2":
            out["attention_bias"] = self.o_bias
        return out


def num_params(config: ModelConfig) -> int:
    """The parameter count, from the configuration alone (matches `jax.eval_shape` of init)."""
    d, f, v, dh = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    h, kv = config.num_heads, config.num_kv_heads
    per_layer = d * dh * (2 * h + 2 * kv) + 3 * d * f + 2 * d
    per_layer += (h + 2 * kv) * dh * config.qkv_bias + d * config.o_bias + 2 * dh * config.qk_norm
    return v * d * (1 if config.tie_embeddings else 2) + d + config.num_layers * per_layer
