"""The cases of `kljax bench kl`: inputs, the kljax function and its PyTorch twin for each case.

Every case is a scalar loss differentiated once: a kljax case is `fn(*inputs) -> (value, grads)`
(jitted by the caller), a PyTorch case `fn(*tensors) -> (value, grads)` in eager mode.
Per-token inputs: (logp, ref_logp, sampler_logp, mask), each [B, T] float32, gradient in logp.
Full-vocabulary inputs: (h, ref_h, W, ref_W) with h [B, T, D] and W [V, D], gradient in (W, h).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.rl import estimators as est
from kljax.rl.kl import KLConfig, kl_terms
from kljax.rl.objective import kl_surrogate

ESTIMATOR_CASES = {"k1": est.k1, "k2": est.k2, "k3": est.k3}
TERMS_CONFIG = KLConfig(estimator="k3", placement="loss")
SURROGATE_CONFIG = KLConfig(estimator="k3", placement="both", credit="reward_to_go")


def token_inputs(rng: np.random.Generator, b: int, t: int) -> tuple[jax.Array, ...]:
    """logp < 0; ref and sampler log-probs near it; a mask with lengths in [T/2, T]. Each [B, T]."""
    logp = -2.0 * np.abs(rng.standard_normal((b, t))) - 0.01
    ref = logp + 0.1 * rng.standard_normal((b, t))
    sampler = logp + 0.05 * rng.standard_normal((b, t))
    lengths = rng.integers(max(1, t // 2), t + 1, b)
    mask = np.arange(t)[None] < lengths[:, None]
    return tuple(jnp.asarray(x, jnp.float32) for x in (logp, ref, sampler, mask))


def full_inputs(rng: np.random.Generator, b: int, t: int, d: int, v: int, dtype: str) -> tuple[jax.Array, ...]:
    """h ~ N(0, 1) [B, T, D], W ~ N(0, 0.02^2) [V, D]; the reference's h and W perturbed enough that
    the KL is far from 0 (about 0.3 per position at D = 896)."""
    keys = jax.random.split(jax.random.key(int(rng.integers(2**31))), 4)
    h = jax.random.normal(keys[0], (b, t, d), jnp.float32)
    w = 0.02 * jax.random.normal(keys[1], (v, d), jnp.float32)
    ref_h = h + 0.5 * jax.random.normal(keys[2], (b, t, d), jnp.float32)
    ref_w = w + 0.01 * jax.random.normal(keys[3], (v, d), jnp.float32)
    return tuple(x.astype(dtype) for x in (h, ref_h, w, ref_w))


def full_input_shapes(b: int, t: int, d: int, v: int, dtype: str) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Abstract full-vocabulary inputs, for compile-only memory analysis."""
    hs, ws = jax.ShapeDtypeStruct((b, t, d), jnp.dtype(dtype)), jax.ShapeDtypeStruct((v, d), jnp.dtype(dtype))
    return hs, hs, ws, ws


def _head_config(v: int, d: int, dtype: str) -> ModelConfig:
    """A one-layer tied model config: only its unembedding (vocab v, hidden d) is used."""
    return ModelConfig(architecture="Qwen2ForCausalLM", vocab_size=v, hidden_size=d, intermediate_size=d,
                       num_layers=1, num_heads=1, num_kv_heads=1, head_dim=d, tie_embeddings=True,
                       param_dtype=dtype, dtype=dtype)


def jax_case(case: str, chunk: int, dtype: str) -> Any:
    """fn(*inputs) -> (loss, grads) for `case` (see the module docstring for the inputs)."""
    if case in ESTIMATOR_CASES:
        k = ESTIMATOR_CASES[case]
        loss = lambda logp, ref, sampler, mask: jnp.sum(k(est.log_ratio(logp, ref)) * mask)
    elif case == "kl_terms":
        loss = lambda logp, ref, sampler, mask: jnp.sum(kl_terms(TERMS_CONFIG, logp, ref, mask, sampler).loss_b)
    elif case == "kl_surrogate":
        loss = lambda logp, ref, sampler, mask: jnp.sum(kl_surrogate(SURROGATE_CONFIG, logp, ref, mask, sampler))
    elif case in ("full_kl_chunked", "full_kl_naive"):
        from kljax.policies.transformer import full_kl_from_hidden

        def loss(h, ref_h, w, ref_w):
            config = _head_config(w.shape[0], w.shape[1], dtype)
            params, ref_params = {"embed": w}, {"embed": jax.lax.stop_gradient(ref_w)}
            if case == "full_kl_chunked":
                return jnp.sum(full_kl_from_hidden(params, ref_params, h, ref_h, config, chunk))
            return jnp.sum(est.full_kl_from_logits(tfm.logits_from_hidden(params, h, config),
                                                   tfm.logits_from_hidden(ref_params, ref_h, config)))

        return jax.value_and_grad(loss, argnums=(2, 0))
    else:
        raise ValueError(f"unknown kl bench case {case!r}")
    return jax.value_and_grad(loss)


def torch_case(case: str, inputs: tuple[jax.Array, ...], chunk: int, device: str) -> tuple[Any, tuple]:
    """The PyTorch eager twin of `jax_case(case)`, and the same inputs as tensors on `device`."""
    import torch

    from benchmarks import torch_losses as tl

    def tensor(x: jax.Array, grad: bool = False) -> torch.Tensor:
        out = torch.from_numpy(np.array(x, np.float32)).to(device, getattr(torch, str(x.dtype)))
        return out.requires_grad_(grad)

    if case in ("full_kl_chunked", "full_kl_naive"):
        h, ref_h, w, ref_w = inputs
        tensors = (tensor(h, True), tensor(ref_h), tensor(w, True), tensor(ref_w))
        size = chunk if case == "full_kl_chunked" else None

        def full(h, ref_h, w, ref_w):
            loss = tl.full_kl_from_hidden(w, ref_w, h, ref_h, size).sum()
            return loss.detach(), torch.autograd.grad(loss, [w, h])

        return full, tensors

    logp, ref, sampler, mask = inputs
    tensors = (tensor(logp, True), tensor(ref), tensor(sampler), tensor(mask))
    if case in tl.ESTIMATORS:
        k = tl.ESTIMATORS[case]
        loss_fn = lambda logp, ref, sampler, mask: (k(logp - ref) * mask).sum()
    elif case == "kl_terms":
        loss_fn = lambda logp, ref, sampler, mask: (tl.k3(tl.masked(logp, mask) - tl.masked(ref, mask)) * mask).sum()
    elif case == "kl_surrogate":
        loss_fn = lambda logp, ref, sampler, mask: tl.kl_surrogate_both_rtg(logp, ref, mask, sampler).sum()
    else:
        raise ValueError(f"unknown kl bench case {case!r}")

    def per_token(logp, ref, sampler, mask):
        loss = loss_fn(logp, ref, sampler, mask)
        return loss.detach(), torch.autograd.grad(loss, [logp])

    return per_token, tensors


def compare(jax_out: Any, torch_out: Any, dtype: str) -> dict[str, Any]:
    """Relative differences of the two sides' value and gradients; ok within 1e-3 (5e-2 in bf16)."""
    value, grads = jax_out
    t_value, t_grads = torch_out
    grads = grads if isinstance(grads, tuple) else (grads,)
    t_value = float(t_value)
    value_rel = abs(float(value) - t_value) / max(abs(t_value), 1e-12)
    grad_rel = 0.0
    for g, tg in zip(grads, t_grads, strict=True):
        tg = tg.float().cpu().numpy()
        diff = float(np.max(np.abs(np.asarray(g, np.float32) - tg)))
        grad_rel = max(grad_rel, diff / max(float(np.max(np.abs(tg))), 1e-12))
    tol = 1e-3 if dtype == "float32" else 5e-2
    return {"value_rel_diff": value_rel, "grad_rel_diff": grad_rel, "tol": tol,
            "ok": value_rel <= tol and grad_rel <= tol}


def memory(compiled: Any) -> dict[str, int | None]:
    """argument/output/temp bytes of a compiled XLA executable, and peak = their sum less aliasing."""
    try:
        ma = compiled.memory_analysis()
    except (NotImplementedError, AttributeError):
        ma = None
    if ma is None:
        return {"argument_bytes": None, "output_bytes": None, "temp_bytes": None, "peak_bytes": None}
    out = {"argument_bytes": int(ma.argument_size_in_bytes), "output_bytes": int(ma.output_size_in_bytes),
           "temp_bytes": int(ma.temp_size_in_bytes)}
    out["peak_bytes"] = sum(out.values()) - int(getattr(ma, "alias_size_in_bytes", 0))
    return out
