"""The matmul floor of a policy update: its weight matmuls alone, forward and backward.

    floor seconds = the update's weight matmuls: per layer x @ W for the fused q/k/v, the output,
                    the fused gate/up and the down projection over the B x S tokens, the unembedding
                    over the B x R response positions, and for each the backward's dy @ W^T and x^T @ dy

They run through `kljax.kernels.cpu.matmul.matmul`, the train step's own projection with its row-major
backward, in the compute dtype with float32 accumulation, chained through a residual so that
nothing can be skipped. Left out: attention (its score and value products included), norms, RoPE,
the log-softmax over the vocabulary, the loss and AdamW, all of which a real update adds. The
model FLOPs of the floor are those of `common.train_flops` without its attention term.

`floor tokens/s` = B * S / floor seconds bounds any update built on these matmul kernels, whatever
else it does: `kljax bench train` prints it beside both sides' speeds, so that whether a ratio over
the peer is reachable at all is a measurement.
"""

from __future__ import annotations

from typing import Any

from benchmarks import common


def matmul_floor(config: Any, batch: int, seq_len: int, response_len: int, repeats: int = 3) -> dict[str, Any]:
    """Median seconds of the update's weight matmuls (see the module docstring) and the floor
    speed batch * seq_len / seconds in trained tokens per second."""
    import jax
    import jax.numpy as jnp

    from kljax.kernels.cpu.matmul import matmul

    dt = config.jnp_dtype
    tokens, head_rows = batch * seq_len, batch * response_len
    normal = common.normal_init(dt)
    # layer_matmul_shapes gives (out, in); the train step's weights are [in, out]
    layers = [[normal((i, o)) for o, i in common.layer_matmul_shapes(config)] for _ in range(config.num_layers)]
    head = normal((config.hidden_size, config.vocab_size))
    x = normal((tokens, config.hidden_size))

    def loss(layers: list, head: jax.Array, x: jax.Array) -> jax.Array:
        for qkv, o, gate_up, down in layers:
            # the barriers keep XLA from narrowing a dot to the columns sliced from it
            x = x + matmul(jax.lax.optimization_barrier(matmul(x, qkv))[:, : o.shape[0]], o)
            gate, up = jnp.split(jax.lax.optimization_barrier(matmul(x, gate_up)), 2, axis=1)
            x = x + matmul(gate * up, down)
        return jnp.sum(matmul(x[:head_rows], head).astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    seconds = common.median_seconds(lambda: jax.block_until_ready(grads(layers, head, x)), repeats)
    return {"seconds": seconds, "tokens_per_s": tokens / seconds}
