"""The matmul floor of a generate: the time of the work no sampler on this machine can skip.

    floor seconds = prefill + (N - 1) decode steps' weight matmuls alone

Prefill is kljax's own (`kljax.sampling.step.prefill`, the model's forward over the B x P prompt tokens).
A decode step's weight matmuls are those of `kljax.sampling.step._decode_layer` in its fastest form on
XLA CPU (feature-major, W [out, in] @ x [in, B], float32 accumulation): per layer the fused q/k/v,
the output, the fused gate/up and the down projection, then the unembedding [V, D] @ [D, B]; the
loop carries a residual so that no step can be skipped or hoisted. Left out: attention over the
cache and its writes, norms, RoPE, the softmax over the vocabulary and the draw, all of which a real
step adds.

`floor tokens/s` = B * N / floor seconds bounds any sampler built on these kernels: `kljax bench
decode` prints it beside the peer's speed, so that whether a speed ratio is reachable at all (a 2x
ratio needs 2x the peer's speed at or below the floor) is a measurement, not a guess. The same
small-column matmuls in PyTorch (oneDNN / MKL) ran at the XLA rate in float32 here (about 120
GFLOP/s at 32 columns), so the floor is not specific to XLA.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from benchmarks import common


def matmul_floor(params: Any, config: Any, prompts_bp: np.ndarray, new_tokens: int, repeats: int = 3
                 ) -> dict[str, Any]:
    """Median seconds of the prefill and of the N - 1 decode steps' weight matmuls (see the module
    docstring), and the floor speed B * N / (their sum) in generated tokens per second."""
    import jax
    import jax.numpy as jnp

    from kljax.models.transformer import positions_from_mask
    from kljax.sampling.step import prefill, weight_matmul

    b = prompts_bp.shape[0]
    tokens = jnp.asarray(prompts_bp)
    mask = jnp.ones(tokens.shape, bool)
    run_prefill = jax.jit(functools.partial(prefill, config=config))
    positions = positions_from_mask(mask)

    dt = config.jnp_dtype
    normal = common.normal_init(dt)
    layers = [[normal(shape) for shape in common.layer_matmul_shapes(config)] for _ in range(config.num_layers)]
    head = normal((config.vocab_size, config.hidden_size))

    def step(_: Any, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        x, logits = carry
        for qkv, o, gate_up, down in layers:
            # the barriers keep XLA from narrowing a dot to the rows sliced from it
            x = x + weight_matmul(o, jax.lax.optimization_barrier(weight_matmul(qkv, x))[: o.shape[1]])
            gate, up = jnp.split(jax.lax.optimization_barrier(weight_matmul(gate_up, x)), 2)
            x = x + weight_matmul(down, gate * up)
        logits = jnp.dot(head, x, preferred_element_type=jnp.float32)
        return x + logits[: x.shape[0]].astype(x.dtype) * 1e-3, logits

    @jax.jit
    def run_decode(x_db: jax.Array) -> jax.Array:
        logits = jnp.zeros((config.vocab_size, b), jnp.float32)
        return jax.lax.fori_loop(0, new_tokens - 1, step, (x_db, logits))[1]

    x = jnp.ones((config.hidden_size, b), dt)
    phases = {"prefill_s": lambda: run_prefill(params, tokens, mask, positions)[0].block_until_ready(),
              "decode_matmul_s": lambda: run_decode(x).block_until_ready()}
    out: dict[str, Any] = {name: common.median_seconds(fn, repeats) for name, fn in phases.items()}
    out["seconds"] = out["prefill_s"] + out["decode_matmul_s"]
    out["tokens_per_s"] = b * new_tokens / out["seconds"]
    return out
