"""A run's pieces, built once before the loop (`kljax.train.trainer`) starts: the mesh, the task and
its reward, the model (with LoRA: adapters over one frozen base, which is also the reference), the
optimizer, the jitted score and train-step functions, and the initial train state.

    run, state, ref_params = build(settings, reward_funcs)

Every data, size and reward-signature check runs before the model's weights load and before
anything compiles (`load_policy`'s before_weights hook). `kljax bench rl` builds its kljax side with
the same `build`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax

from kljax.models.config import ModelConfig
from kljax.models.policy_api import frozen_copy
from kljax.parallel import distributed
from kljax.parallel import sharding as shd
from kljax.train import state as st
from kljax.train.config import RunSettings, check_against_model
from kljax.train.memory_check import check_train_fits
from kljax.train.policy import Policy, load_policy
from kljax.train.rollout import policy_scored_in_update, run_stops, sampler_is_policy
from kljax.train.step import StepSettings, batch_shardings, score, train_step


@dataclasses.dataclass
class Run:
    """Everything the loop needs, built once. `policy.params` is None: the weights live in the train
    state (trained) and the reference params (frozen) that `build` returns."""

    settings: RunSettings
    policy: Policy
    task: Any
    mesh: Any
    tx: Any
    state_shardings: Any
    step_fn: Any
    score_fn: Any
    place: Any
    reward: Any = None  # a `reward_set.RewardSet` (config.reward), or None for the task's own reward
    exact: Any = None  # (params, beta) -> exact metrics, for a task with a known optimum (`Task.exact_optimum`)
    data_offset: int = 0  # file tasks: the epoch stream's position is step * prompts_per_step + this
    base: Any = None  # model.lora: the frozen base (also the reference); the state trains adapters over it
    base_identity: Any = None  # model.lora: the base's {"source", "path", "sha256"} (`models.base_identity`)
    kl_in_update: bool = False  # the update's forward reports the KL metrics (`rollout.policy_scored_in_update`)

    def policy_params(self, trained: Any) -> Any:
        """The policy's full params from what the state trains (with LoRA: base + adapters, no copy)."""
        if self.base is None:
            return trained
        from kljax.models.lora import combine

        return combine(self.base, trained)


def enable_compilation_cache() -> None:
    """Persist XLA compilations across runs (a resumed or repeated run skips most compile time),
    under $KLJAX_CACHE/xla (default ~/.cache/kljax/xla), unless JAX already has a cache directory."""
    if jax.config.jax_compilation_cache_dir:
        return
    from kljax.models.default import cache_root

    jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def under_mesh(fn: Any, mesh: Any) -> Any:
    """Call `fn` (a jitted function) with `mesh` as the context mesh, so that tracing sees it and
    the model's activation constraints (`sharding.constrain_batch`) apply."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with jax.set_mesh(mesh):
            return fn(*args, **kwargs)

    return call


def build(settings: RunSettings, reward_funcs: Sequence[Any] | None = None) -> tuple[Run, st.TrainState, Any]:
    """Mesh, model, task and jitted functions; the initial state and the frozen reference params.
    `reward_funcs` (callables or specs, `kljax.RLTrainer`) replace config.reward.functions."""
    from kljax.tasks.from_config import check_prompts, eval_split_names, task_from_config
    from kljax.train.reward_model_run import reward_from_config
    from kljax.train.reward_set import RewardSet

    enable_compilation_cache()
    mesh_shape = distributed.check_mesh(settings.mesh, jax.device_count(), settings.rl)
    mesh = shd.make_mesh(*mesh_shape)
    task = task_from_config(settings.raw)  # a registered task, or the user's files (kljax.tasks.files)
    task.validate_split(settings.raw.task.split)
    with settings.raw.unlocked():  # "" = the data's own evaluation split(s): recorded as resolved
        settings.raw.task.eval_splits = ",".join(eval_split_names(settings.raw, task))
    held_out = getattr(task, "held_out", None)
    if held_out and distributed.is_main_process():
        print(f"kljax train: task.eval_fraction={settings.raw.task.eval_fraction:g} holds out {held_out[0]} of "
              f"{held_out[1]} rows of {settings.raw.task.path} as split 'test' for evaluation (0 trains on all)",
              flush=True)
    functions = RewardSet.from_config(settings.raw, task, reward_funcs)  # signatures bound before the model loads
    rl = settings.rl
    task.check_run_settings(rl.max_prompt_len, rl.max_new_tokens, str(settings.raw.task.prompt_format))
    num_shards = mesh.shape["data"] * mesh.shape["fsdp"]

    def before_weights(model: Any, tokenizer: Any) -> None:  # the data and sizes, before anything compiles
        transformer = isinstance(model, ModelConfig)
        distributed.check_mesh(mesh_shape, jax.device_count(), settings.rl, model if transformer else None)
        max_positions = model.max_position_embeddings if transformer else rl.max_prompt_len + rl.max_new_tokens
        check_against_model(settings, max_positions, num_shards)
        dropped = check_prompts(task, settings.raw, tokenizer, context=max_positions)  # every file row
        if any(dropped.values()) and distributed.is_main_process():
            print(f"kljax train: dropped prompts longer than rl.max_prompt_len={settings.rl.max_prompt_len}: "
                  + ", ".join(f"{n} of split {s!r}" for s, n in dropped.items() if n), flush=True)
        check_train_fits(model, rl)  # a lower bound on the memory, against what the machine has
        run_stops(rl.stop, tokenizer, model)  # rl.stop: an id past the vocabulary, a string no token writes

    policy = load_policy(settings.raw.model, mesh, seed=settings.seed, task=task, before_weights=before_weights)
    transformer = isinstance(policy.model, ModelConfig)
    reward = reward_from_config(settings.raw, task, mesh, policy, functions)
    tx = st.make_optimizer(settings.optim)
    # Two copies of the weights, not three: the state gets its own copy (donated to and updated by
    # every train step), the frozen reference is the loaded one (never donated nor updated; the async
    # snapshots start as the same buffers), or with a 16-bit compute dtype over float32 params its
    # exact half-size copy in the compute dtype (`transformer.frozen_copy`), and the policy keeps none.
    lora_base = None
    if transformer and policy.model.lora is not None:  # one copy: the frozen base is policy and reference
        state, state_sh, ref_params, lora_base = _lora_state(policy, tx, mesh, settings)
    else:
        state, state_sh = st.state_from_params(policy.params, tx, policy.param_shardings, mesh, settings.seed)
        ref_params = policy.params
    if transformer and policy.model.jnp_frozen_dtype != policy.model.jnp_param_dtype:
        ref_params = frozen_copy(ref_params, policy.model)
    exact = task.exact_optimum(policy.model, ref_params)  # None but for a task with a known optimum
    policy = dataclasses.replace(policy, params=None)
    in_update = policy_scored_in_update(rl, settings.kl, policy.model)  # then the step reports the KL metrics
    step_settings = StepSettings.from_rl(policy.model, settings.kl, rl, kl_metrics=in_update)
    # The XLA-CPU kernels update layer by layer in place (`optimizer_step.update_in_place`); plain
    # kernels apply the optax chain itself: the same numbers and the same optimizer state.
    step_tx = settings.optim if transformer and policy.model.cpu_kernels else tx
    step_fn = under_mesh(jax.jit(functools.partial(train_step, settings=step_settings, tx=step_tx),
                                 out_shardings=(state_sh, None), donate_argnums=0), mesh)
    full = settings.kl.estimator == "full"
    rescore = not sampler_is_policy(rl, settings.kl, policy.model) and not in_update
    score_fn = under_mesh(jax.jit(functools.partial(score, model=policy.model, micro_batches=rl.micro_batches,
                                                    full_kl=full, policy=rescore,
                                                    temperature=rl.policy_temperature)), mesh)

    def place(batch):
        return jax.device_put(batch, batch_shardings(batch, mesh))

    run = Run(settings, policy, task, mesh, tx, state_sh, step_fn, score_fn, place, reward, exact,
              base=ref_params if lora_base is not None else None, base_identity=lora_base, kl_in_update=in_update)
    return run, state, ref_params


def _lora_state(policy: Policy, tx: Any, mesh: Any, settings: RunSettings) -> tuple[Any, Any, Any, dict]:
    """(state over fresh LoRA adapters, its shardings, the base params, the base's identity): the state
    holds only the adapters and their optimizer moments; the loaded weights are the frozen base."""
    from kljax.models import lora
    from kljax.models.base_identity import base_identity

    model = policy.model
    identity = base_identity(str(settings.raw.model.source), policy.params)
    key = jax.random.fold_in(jax.random.PRNGKey(settings.seed), 1)
    state, state_sh = st.create_state(lambda: lora.init_adapters(model, key), tx, st.adapter_shardings(model, mesh),
                                      mesh, settings.seed)
    return state, state_sh, policy.params, identity
