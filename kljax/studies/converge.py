"""Training runs of the trainer's own update on a toy task, measured exactly at every step.

One iteration, as `kljax.train.trainer.iteration` does it on the tabular policy:
    sampler params (the current ones, or with async_level A those of A steps earlier: a queue
    initialised with pi_ref, oldest first) --TabularPolicy.sample--> G responses per prompt
    --reward table--> rewards --step.score--> log pi, log pi_ref (and the full KL)
    --rollout.assemble_batch--> advantages (RLOO) with the reward-placed KL
    --step.train_step (default aggregation, PPO clip 0.2, AdamW with clip 1)--> new params,
then the exact metrics of `exact_optimum.exact_metrics` at the new params. The policy starts at
pi_ref. Runs for several betas x seeds of one KL configuration are one jitted program
(vmap over runs of a lax.scan over iterations); beta is traced, so betas share the compile.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models.transformer import positions_from_mask
from kljax.rl.advantages import Baseline
from kljax.rl.kl import KLConfig
from kljax.sampling.logits import SamplingParams
from kljax.tasks.exact_optimum import ToyTask, exact_metrics, task_logps
from kljax.train.rollout import assemble_batch
from kljax.train.state import OptimConfig, TrainState, make_optimizer
from kljax.train.step import Batch, StepSettings, score, train_step

Array = jax.Array
METRICS = ("gap", "J", "reward", "kl_seq", "kl_opt", "grad_norm", "nonfinite", "clip_fraction")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """steps: iterations; group_size: G samples per prompt; learning_rate: AdamW's peak (cosine
    schedule to end_lr_fraction of it); async_level: sampler staleness (0: on-policy)."""

    steps: int = 300
    group_size: int = 8
    learning_rate: float = 0.1
    end_lr_fraction: float = 0.05
    async_level: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.group_size < 2 or self.async_level < 0 or not self.learning_rate > 0:
            raise ValueError(f"run settings {self}: need steps >= 1, group_size >= 2 (RLOO), async_level >= 0, "
                             "learning_rate > 0")

    def optim(self) -> OptimConfig:
        return OptimConfig(learning_rate=self.learning_rate, schedule="cosine", total_steps=self.steps,
                           end_lr_fraction=self.end_lr_fraction)


def response_codes(tokens_nr: Array, mask_nr: Array, vocab: int) -> Array:
    """A distinct integer per response: sum_t [mask] (y_t + 1) (V + 1)^t, [N]."""
    powers = (vocab + 1) ** jnp.arange(tokens_nr.shape[1], dtype=jnp.int32)
    return jnp.sum(jnp.where(mask_nr, tokens_nr + 1, 0) * powers, axis=1)


def make_iteration(task: ToyTask, kl: KLConfig, run: RunSettings):
    """iteration((state, queue), (key, beta)) -> ((state, queue), metrics): one pure RL iteration.
    queue: the sampler's earlier params stacked on a leading axis [max(A, 1), ...] (unused if A = 0)."""
    policy, g = task.policy, run.group_size
    prompts_p1 = np.arange(task.num_prompts, dtype=np.int32)[:, None]
    prompt_b = jnp.repeat(jnp.arange(task.num_prompts, dtype=jnp.int32), g)
    codes_n = response_codes(jnp.asarray(task.responses_nr), jnp.asarray(task.mask_nr), task.vocab)
    rewards_pn = jnp.asarray(task.rewards_pn, jnp.float32)
    sampling = SamplingParams(max_new_tokens=task.response_len, stop_token_ids=(task.stop_token,), n=g)
    settings = StepSettings(model=policy, kl=kl)
    tx = make_optimizer(run.optim())
    full = kl.estimator == "full" and kl.placement != "none"
    ref = task.ref_params
    ref_logp_pn = task_logps(task, ref)

    def iteration(carry: tuple[TrainState, Any], inputs: tuple[Array, Array]):
        state, queue = carry
        key, beta = inputs
        sampler = jax.tree.map(lambda q: q[0], queue) if run.async_level else state.params
        res = policy.sample(sampler, prompts_p1, None, key, sampling)
        codes_b = response_codes(res.response_tokens_rn, res.response_mask_rn, task.vocab)
        index_b = jnp.argmax(codes_b[:, None] == codes_n[None, :], axis=1)
        mask_br = res.response_mask_rn.astype(jnp.float32)
        partial = Batch(res.sequence_tokens_rs, res.sequence_mask_rs, positions_from_mask(res.sequence_mask_rs),
                        mask_br, res.response_logprobs_rn, jnp.zeros_like(mask_br), jnp.zeros_like(mask_br),
                        beta.astype(jnp.float32))
        scored = score(state.params, ref, partial, policy, full_kl=full)
        batch = assemble_batch(partial, scored, rewards_pn[prompt_b, index_b], kl=kl, beta=beta,
                               baseline=Baseline("rloo", g))
        if run.async_level:
            queue = jax.tree.map(lambda q, p: jnp.concatenate([q[1:], p[None]]), queue, state.params)
        state, step_metrics = train_step(state, batch, ref, settings=settings, tx=tx)
        exact = exact_metrics(task_logps(task, state.params), ref_logp_pn, rewards_pn, beta)
        out = {**exact, **{k: step_metrics[k] for k in ("grad_norm", "nonfinite", "clip_fraction")}}
        return (state, queue), {k: out[k] for k in METRICS}

    return iteration, tx


def train_runs(task: ToyTask, kl: KLConfig, run: RunSettings, betas: Array, seeds: Array,
               return_params: bool = False) -> Any:
    """Every beta x seed run of one configuration from pi_ref: METRICS at steps 0..steps (step 0:
    pi_ref), each [steps + 1, len(betas), len(seeds)] float numpy; with return_params also the
    final params (leaves [len(betas), len(seeds), ...])."""
    iteration, tx = make_iteration(task, kl, run)
    ref = task.ref_params
    ref_logp_pn = task_logps(task, ref)

    def one(beta: Array, seed: Array) -> dict[str, Array]:
        state = TrainState(ref, tx.init(ref), jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.uint32))
        queue = jax.tree.map(lambda p: jnp.repeat(p[None], max(run.async_level, 1), axis=0), ref)
        keys = jax.random.split(jax.random.PRNGKey(seed), run.steps)
        (state, _), metrics = jax.lax.scan(iteration, (state, queue), (keys, jnp.full((run.steps,), beta)))
        start = exact_metrics(ref_logp_pn, ref_logp_pn, task.rewards_pn, beta)
        start.update(grad_norm=0.0, nonfinite=0.0, clip_fraction=0.0)
        curves = {k: jnp.concatenate([jnp.asarray(start[k], v.dtype)[None], v]) for k, v in metrics.items()}
        return curves, state.params

    betas, seeds = jnp.asarray(betas, jnp.float32), jnp.asarray(seeds, jnp.uint32)
    runs, params = jax.jit(jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None)))(betas, seeds)
    out = {k: np.moveaxis(np.asarray(v), -1, 0) for k, v in runs.items()}
    return (out, params) if return_params else out
