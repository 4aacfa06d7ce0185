"""Where a KL configuration's expected update leads: exact expected-gradient ascent to its fixed point.

On-policy with RLOO (its baseline has zero mean) the trainer's expected update is, up to the
aggregation's constant 1/R, the gradient of the surrogate (every response y enumerated, each prompt
weighted 1/P, sg = stop_gradient, `kljax.rl.kl.kl_terms` giving the configuration's pieces)
    S(theta) = mean_p sum_y sg(pi(y|p)) [ sum_t log pi(y_t|h_t) sg(R(y) - beta penalty_t(y)) - beta loss(y) ].
For an unbiased configuration grad S = grad J, so its fixed point is pi*; a biased one may have
another (k3 in the loss: a per-token forward KL with prefixes frozen) or none (k1 in the loss, no
KL: the reward alone, driven to a deterministic policy). A stale sampler moves no fixed point:
where the parameters stop moving the queued ones equal them, and the samples are on-policy.
Adam on -S (b2 = 0.9, so its steps stay ~lr while the gradient vanishes) runs `iters` steps at a
constant rate, then `iters // 3` more with a cosine decay to refine; the run `diverges` when the
logits moved more than `move_tol` over the second half of the constant phase (at a fixed point
they only jitter by ~lr), or became non-finite.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from kljax.rl.kl import KLConfig, kl_terms
from kljax.tasks.exact_optimum import ToyTask, enumerated_batch

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FixedPoint:
    """params: the end point's logits per beta (leading axis = betas); diverges [len(betas)] bool;
    move: max |logit change| over the last half; grad_norm: |grad S| at the end."""

    params: Any
    diverges: np.ndarray
    move: np.ndarray
    grad_norm: np.ndarray


def surrogate(task: ToyTask, kl: KLConfig, params: Any, beta: Array) -> Array:
    """S(theta) above (its gradient is the on-policy expected update times R)."""
    tokens, mask, positions, rmask = enumerated_batch(task.responses_nr, task.mask_nr, task.num_prompts)
    mask_br = rmask.astype(jnp.float32)
    rewards_b = jnp.asarray(task.rewards_pn, jnp.float32).reshape(-1)
    r, full_kl = task.response_len, kl.estimator == "full"
    out = task.policy.teacher_forced(params, tokens, mask, positions, r, full_kl=full_kl,
                                     ref_params=jax.lax.stop_gradient(task.ref_params) if full_kl else None)
    logp = jnp.where(mask_br > 0, out["logp"], 0.0)
    ref_logp = task.policy.teacher_forced(task.ref_params, tokens, mask, positions, r)["logp"]
    full = out.get("full_kl")
    terms = kl_terms(kl, logp, ref_logp, mask_br, None, full)
    weight_b = jax.lax.stop_gradient(jnp.exp(jnp.sum(logp, axis=1))) / task.num_prompts
    advantage_bt = jax.lax.stop_gradient(rewards_b[:, None] - beta * terms.penalty_bt)
    per_seq = jnp.sum(logp * advantage_bt * mask_br, axis=1) - beta * terms.loss_b
    return jnp.sum(weight_b * per_seq)


def find_fixed_points(task: ToyTask, kl: KLConfig, betas: Array, iters: int = 4000, learning_rate: float = 0.1,
                      move_tol: float = 0.5) -> FixedPoint:
    """Adam ascent on S from pi_ref for each beta (vmapped); see the module docstring."""
    refine = iters // 3
    schedule = optax.join_schedules(
        [optax.constant_schedule(learning_rate), optax.cosine_decay_schedule(learning_rate, refine, alpha=1e-3)],
        [iters])
    tx = optax.adam(schedule, b2=0.9)
    grad_fn = jax.grad(lambda p, b: -surrogate(task, kl, p, b))

    def one(beta: Array):
        def body(carry, _):
            params, opt = carry
            updates, opt = tx.update(grad_fn(params, beta), opt, params)
            return (optax.apply_updates(params, updates), opt), None

        start = task.ref_params
        half, _ = jax.lax.scan(body, (start, tx.init(start)), None, length=iters // 2)
        full, _ = jax.lax.scan(body, half, None, length=iters - iters // 2)
        (end, _), _ = jax.lax.scan(body, full, None, length=refine)
        move = jnp.max(jax.flatten_util.ravel_pytree(jax.tree.map(lambda a, b: jnp.abs(a - b), full[0], half[0]))[0])
        return end, move, optax.tree.norm(grad_fn(end, beta))

    params, move, gnorm = jax.jit(jax.vmap(one))(jnp.asarray(betas, jnp.float32))
    move, gnorm = np.asarray(move), np.asarray(gnorm)
    leaves = [np.isfinite(np.asarray(x)).reshape(len(move), -1).all(axis=1) for x in jax.tree.leaves(params)]
    finite = np.isfinite(move) & np.logical_and.reduce(leaves)
    return FixedPoint(params, ~finite | (move > move_tol), move, gnorm)
