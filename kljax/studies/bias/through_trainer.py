"""The expected update of the real rollout and train step, by enumerating every batch exactly.

On a `TabularPolicy` with a stop token, every response y is enumerable (`tabular.all_responses`),
and so is every batch: one group of G responses for each prompt, each drawn from the sampler mu.
For each batch the real pieces run: `step.score` (policy and reference log-probs), the rollout's
`assemble_batch` (advantages with the reward-placed KL folded in) and `step.train_step` with
SGD(lr = 1), whose update params - new_params is the gradient the trainer takes. Then
    E[g] = sum_batches prod_rows mu(y_row | prompt) * g(batch),
against the truth grad(-J), J = mean_p (E_pi[R_p] - beta KL_seq,p), computed from the exact
sequence probabilities. What `kljax.verdicts.objective` claims is checked against this by
tests/test_objective_exact.py.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from kljax.models.transformer import positions_from_mask
from kljax.policies.tabular import TabularPolicy, all_responses
from kljax.rl.advantages import Baseline
from kljax.rl.kl import KLConfig
from kljax.train.rollout import assemble_batch
from kljax.train.state import TrainState
from kljax.train.step import Batch, StepSettings, score, train_step

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Space:
    """The enumerated problem: a tabular policy over `vocab` tokens (the last one stops a response),
    responses of at most `response_len` tokens, `num_prompts` prompts, groups of `group_size`."""

    vocab: int
    response_len: int
    group_size: int
    num_prompts: int = 2

    @property
    def stop_token(self) -> int:
        return self.vocab - 1

    @property
    def policy(self) -> TabularPolicy:
        return TabularPolicy(self.vocab, self.response_len, self.num_prompts)

    def responses(self) -> tuple[np.ndarray, np.ndarray]:
        return all_responses(self.vocab, self.response_len, self.stop_token)

    def num_batches(self) -> int:
        n = self.responses()[0].shape[0]
        return n ** (self.group_size * self.num_prompts)


def response_logps(policy: TabularPolicy, params: Any, responses_nr: np.ndarray, mask_nr: np.ndarray) -> Array:
    """log pi(y_r | prompt, y_<r) of every response for every prompt, [num_prompts, N, R] (0 where masked)."""
    n = responses_nr.shape[0]
    out = []
    for p in range(policy.num_prompts):
        logits = policy.response_logits(params, jnp.full((n,), p, jnp.int32), jnp.asarray(responses_nr))
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), jnp.asarray(responses_nr)[..., None], -1)[..., 0]
        out.append(jnp.where(jnp.asarray(mask_nr), logp, 0.0))
    return jnp.stack(out)


def objective_value(space: Space, params: Any, ref_params: Any, rewards_pn: Array, beta: float) -> Array:
    """J = mean_p sum_y pi(y|p) (R_p(y) - beta log(pi(y|p) / pi_ref(y|p))), exactly."""
    responses, mask = space.responses()
    logp = jnp.sum(response_logps(space.policy, params, responses, mask), -1)
    ref = jnp.sum(response_logps(space.policy, ref_params, responses, mask), -1)
    return jnp.mean(jnp.sum(jnp.exp(logp) * (rewards_pn - beta * (logp - ref)), -1))


def batch_index(space: Space) -> np.ndarray:
    """Response index of every row of every batch, [num_batches, B] (rows: prompt-major groups)."""
    n = space.responses()[0].shape[0]
    rows = space.group_size * space.num_prompts
    return np.asarray(list(itertools.product(range(n), repeat=rows)), np.int32).reshape(-1, rows)


@functools.partial(jax.jit, static_argnames=("space", "settings", "advantage", "beta"))
def expected_update(
    params: Any, ref_params: Any, sampler_params: Any, rewards_pn: Array, *, space: Space,
    settings: StepSettings, advantage: str, beta: float,
) -> Array:
    """E[params - new_params] of one SGD(1) train step over every batch, flattened [D]."""
    responses, mask = space.responses()
    index_kb = jnp.asarray(batch_index(space))
    g = space.group_size
    prompt_b = jnp.repeat(jnp.arange(space.num_prompts, dtype=jnp.int32), g)
    sampler_pnr = response_logps(space.policy, sampler_params, responses, mask)
    q_kb = jnp.exp(jnp.sum(sampler_pnr[prompt_b[None], index_kb], -1))
    prob_k = jnp.prod(q_kb, axis=1)
    tokens_nr, mask_nr = jnp.asarray(responses), jnp.asarray(mask)
    tx = optax.sgd(1.0)
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.uint32))

    def one(index_b: Array) -> Array:
        tokens = jnp.concatenate([prompt_b[:, None], tokens_nr[index_b]], axis=1)
        seq_mask = jnp.concatenate([jnp.ones((index_b.shape[0], 1), bool), mask_nr[index_b]], axis=1)
        rmask = mask_nr[index_b].astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        partial = Batch(tokens, seq_mask, positions_from_mask(seq_mask), rmask,
                        sampler_pnr[prompt_b, index_b], jnp.zeros_like(rmask), jnp.zeros_like(rmask),
                        jnp.asarray(beta, jnp.float32))
        full = settings.kl.estimator == "full" and settings.kl.placement != "none"
        scored = score(params, ref_params, partial, space.policy, full_kl=full)
        batch = assemble_batch(partial, scored, rewards_pn[prompt_b, index_b], kl=settings.kl, beta=beta,
                               baseline=Baseline(advantage, g))
        new_state, _ = train_step(state, batch, ref_params, settings=settings, tx=tx)
        return jax.flatten_util.ravel_pytree(jax.tree.map(jnp.subtract, params, new_state.params))[0]

    updates_kd = jax.vmap(one)(index_kb)
    return prob_k @ updates_kd


def true_gradient(space: Space, params: Any, ref_params: Any, rewards_pn: Array, kl: KLConfig) -> Array:
    """grad(-J) flattened [D], with beta = 0 when the configuration has no KL term."""
    beta = 0.0 if kl.placement == "none" else kl.beta
    grad = jax.grad(lambda p: -objective_value(space, p, ref_params, rewards_pn, beta))(params)
    return jax.flatten_util.ravel_pytree(grad)[0]
