"""The run's programs as `kljax plan` compiles them: abstract state and batches with shardings, and
the lowered train step, scoring pass and sampler for one mesh (any devices: simulated CPU devices
or a deviceless TPU slice). Nothing is allocated; `kljax.studies.plan` compiles and measures them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from kljax import sampling
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as shd
from kljax.sampling import sampler
from kljax.train import state as st
from kljax.train.rollout import policy_scored_in_update
from kljax.train.step import Batch, StepSettings, score, train_step


@dataclasses.dataclass(frozen=True)
class RunArrays:
    """Abstract (ShapeDtypeStruct) arrays of a run on a mesh.

    params: what the state trains (the model, or the LoRA adapters); frozen: the reference (with
    LoRA, the frozen base it also reads); state: params + optimizer state; policy_params(frozen,
    params): the policy's full parameters.
    """

    model: ModelConfig
    mesh: Mesh
    params: Any
    frozen: Any
    state: Any
    state_sh: Any
    tx: Any
    policy_params: Callable[[Any, Any], Any]

    @property
    def lora_on(self) -> bool:
        return self.model.lora is not None

    @property
    def ref_arg(self) -> tuple[Any, ...]:
        """The train step's extra argument: the frozen base under LoRA (the step reads it)."""
        return (self.frozen,) if self.lora_on else ()


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_run(model: ModelConfig, settings: Any, mesh: Mesh) -> RunArrays:
    """The run's parameters, reference and train state as sharded ShapeDtypeStructs, as
    `run_build.build` lays them out (`settings`: the validated run settings)."""
    p_sh = shd.logical_to_sharding(tfm.logical_axes(model), tfm.param_shapes(model), mesh)
    params = _abstract(tfm.param_shapes(model), p_sh)
    frozen = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, model.jnp_frozen_dtype, sharding=x.sharding),
                          params)  # the reference and async snapshots (`tfm.frozen_copy`)
    if model.lora is not None:  # as `run_build.build`: the state trains the adapters; the base is the reference
        params = _abstract(lora.adapter_shapes(model), st.adapter_shardings(model, mesh))
        p_sh = jax.tree.map(lambda x: x.sharding, params)
    tx = st.make_optimizer(settings.run_optim)
    fresh = functools.partial(st._fresh_state, tx=tx, seed=settings.seed)
    state_shape = jax.eval_shape(fresh, params)
    state_sh = st.state_shardings(state_shape, p_sh, mesh, tx)
    policy_params = lora.combine if model.lora is not None else (lambda base, trained: trained)
    return RunArrays(model, mesh, params, frozen, _abstract(state_shape, state_sh), state_sh, tx, policy_params)


def abstract_batch(mesh: Mesh, rows: int, prompt_len: int, new_tokens: int) -> Batch:
    """A train/score batch of `rows` sequences of prompt_len + new_tokens tokens, rows sharded."""
    seq = prompt_len + new_tokens
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=shd.data_sharding(mesh, len(shape)))
    return Batch(
        tokens_bs=sds((rows, seq), jnp.int32), mask_bs=sds((rows, seq), jnp.bool_),
        positions_bs=sds((rows, seq), jnp.int32), response_mask_br=sds((rows, new_tokens), jnp.float32),
        sampler_logp_br=sds((rows, new_tokens), jnp.float32), ref_logp_br=sds((rows, new_tokens), jnp.float32),
        advantages_br=sds((rows, new_tokens), jnp.float32),
        beta=jax.ShapeDtypeStruct((), jnp.float32, sharding=shd.replicated(mesh)),
    )


def lower_train(run: RunArrays, settings: Any, batch: Batch, micro_batches: int) -> Any:
    """The jitted train step (as the trainer jits it), lowered on `batch`."""
    rl, model = settings.rl, run.model
    step_settings = StepSettings(model, settings.kl, rl.loss_aggregation, rl.clip_low, rl.clip_high,
                                 micro_batches, kl_metrics=policy_scored_in_update(rl, settings.kl, model))
    step_tx = settings.run_optim if model.cpu_kernels else run.tx  # as the trainer (`run_build.build`)
    ref_sh = tuple(jax.tree.map(lambda x: x.sharding, r) for r in run.ref_arg)
    batch_sh = jax.tree.map(lambda x: x.sharding, batch)
    step = jax.jit(functools.partial(train_step, settings=step_settings, tx=step_tx),
                   in_shardings=(run.state_sh, batch_sh, *ref_sh), out_shardings=(run.state_sh, None),
                   donate_argnums=0)
    with jax.set_mesh(run.mesh):  # the context mesh turns on the model's activation sharding constraints
        return step.lower(run.state, batch, *run.ref_arg)


def lower_score(run: RunArrays, batch: Batch, micro_batches: int) -> Any:
    """The scoring pass (policy and reference log-probs), lowered on `batch`."""
    model, combine = run.model, run.policy_params
    scorer = jax.jit(lambda trained, base, b: score(combine(base, trained), base, b, model=model,
                                                    micro_batches=micro_batches))
    with jax.set_mesh(run.mesh):
        return scorer.lower(run.params, run.frozen, batch)


def sampling_params(rl: Any, model: ModelConfig) -> sampling.SamplingParams:
    """The run's sampler settings (as `kljax.train.rollout`, less the tokenizer's stop strings)."""
    return sampling.SamplingParams(max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p,
                                   top_k=rl.top_k, min_p=rl.min_p, stop_token_ids=tuple(model.eos_token_ids),
                                   n=rl.group_size, chunk=rl.sampler_chunk)


def lower_sample(run: RunArrays, sp: sampling.SamplingParams, prompts: int, prompt_len: int) -> Any:
    """The sampler (prefill + decode loop) for `prompts` prompts of `prompt_len` tokens, lowered."""
    rows_sh = shd.data_sharding(run.mesh, 2)
    tokens = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.int32, sharding=rows_sh)
    mask = jax.ShapeDtypeStruct((prompts, prompt_len), jnp.bool_, sharding=rows_sh)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=shd.replicated(run.mesh))
    return sampler._generate_jit.lower(run.policy_params(run.frozen, run.params), tokens, mask, key,
                                       config=run.model, sampling=sp, mesh=run.mesh)
