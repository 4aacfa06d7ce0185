"""A run's pieces, built once before the loop (`kljax.train.trainer`) starts: the mesh, the task and
its reward, the model (with LoRA: adapters over one frozen base, which is also the reference), the
optimizer, the jitted score and train-step functions, and the initial train state.

    run, state, ref_params = build(config, reward_functions)

Every data, size and reward-signature check runs before the model's weights load and before
anything compiles (`load_policy`'s before_weights hook). `kljax bench rl` builds its kljax side with
the same `build`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

import jax

from kljax.config.rl import check_rl_against_model
from kljax.config.run import RunConfig
from kljax.errors import UserError
from kljax.models import lora
from kljax.models.base_identity import base_identity
from kljax.models.config import ModelConfig
from kljax.models.default import cache_root
from kljax.parallel import distributed
from kljax.parallel import sharding as shd
from kljax.policies.protocol import frozen_copy
from kljax.tasks.base import Task
from kljax.tasks.files import FORMATS as FILE_FORMATS
from kljax.tasks.from_config import check_prompts, eval_split_names, task_of
from kljax.train import state as st
from kljax.train.memory_check import check_train_fits
from kljax.train.policy import Policy, load_policy
from kljax.train.reward_model_run import reward_from_config
from kljax.train.reward_set import RewardSet, reward_functions
from kljax.train.rollout import RolloutSetup, policy_scored_in_update, run_stops, sampler_is_policy
from kljax.train.step import StepSettings, batch_shardings, score, train_step


@dataclasses.dataclass
class Run:
    """Everything the loop needs, built once. `config` is the run's, its task.eval_splits resolved
    (what config.json records); `policy.params` is None: the weights live in the train state
    (trained) and the reference params (frozen) that `build` returns.

    reward: the run's RewardSet, or None for the task's own reward; exact: (params, beta) -> exact
    metrics for a task with a known optimum; data_offset: file tasks read their epoch stream at
    step * prompts_per_step + this; base / base_identity: with LoRA, the frozen base (also the
    reference) and its {"source", "path", "sha256"}; kl_in_update: the update's forward reports the
    KL metrics (`rollout.policy_scored_in_update`)."""

    config: RunConfig
    policy: Policy
    task: Task
    mesh: jax.sharding.Mesh
    tx: Any
    state_shardings: Any
    step_fn: Any
    score_fn: Any
    reward: RewardSet | None = None
    exact: Any = None
    data_offset: int = 0
    base: Any = None
    base_identity: dict[str, Any] | None = None
    kl_in_update: bool = False

    def policy_params(self, trained: Any) -> Any:
        """The policy's full params from what the state trains (with LoRA: base + adapters, no copy)."""
        return trained if self.base is None else lora.combine(self.base, trained)

    def place(self, batch: Any) -> Any:
        return jax.device_put(batch, batch_shardings(batch, self.mesh))

    @property
    def rollout_setup(self) -> RolloutSetup:
        """What each of the run's rollouts shares (`kljax.train.rollout.rollout`)."""
        c, p = self.config, self.policy
        return RolloutSetup(self.task, p.tokenizer, p.model, c.rl, c.kl, self.score_fn, p.stop_token_ids, p.pad_id,
                            c.task.prompt_format, self.place, self.mesh, self.reward)


def check_something_scores(config: RunConfig) -> None:
    """The user's data with no reward function, no reward model and no answer column for the task's own
    check would train on reward 0 at every step: a UserError saying what to give instead."""
    if config.task.name in FILE_FORMATS and not (config.reward.functions or config.reward.model
                                                  or config.task.answer_key):
        raise UserError("no reward function (reward_funcs, or reward.functions) and no answer column "
                        "(task.answer_key) for the task's own check, so every reward would be 0; pass reward "
                        "functions, or name the answer column (config={'task.answer_key': 'COLUMN'}, or "
                        "--config.task.answer_key=COLUMN)")


def enable_compilation_cache() -> None:
    """Persist XLA compilations across runs (a resumed or repeated run skips most compile time) under
    $KLJAX_CACHE/xla (default ~/.cache/kljax/xla); KLJAX_XLA_CACHE=0 turns it off. A cache directory
    JAX already has (JAX_COMPILATION_CACHE_DIR) is left as it is."""
    if jax.config.jax_compilation_cache_dir:
        return
    wanted = os.environ.get("KLJAX_XLA_CACHE", "1")
    if wanted not in ("0", "1"):
        raise UserError(f"KLJAX_XLA_CACHE={wanted!r}: expected 1 (persist XLA compilations) or 0 (do not)")
    if wanted == "1":
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def under_mesh(fn: Any, mesh: Any) -> Any:
    """Call `fn` (a jitted function) with `mesh` as the context mesh, so that tracing sees it and
    the model's activation constraints (`sharding.constrain_batch`) apply."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with jax.set_mesh(mesh):
            return fn(*args, **kwargs)

    return call


def build(config: RunConfig, functions: Sequence[Any] | None = None,
          reward_guard: Any = None) -> tuple[Run, st.TrainState, Any]:
    """Mesh, model, task and jitted functions; the initial state and the frozen reference params.
    `functions`: the reward functions (`reward_set.reward_functions`; None: those of config.reward);
    `reward_guard`: the context the user's in-process reward calls run in (`RewardSet`)."""
    enable_compilation_cache()
    rl = config.rl
    mesh_shape = distributed.check_mesh(config.mesh.shape, jax.device_count(), rl)
    mesh = shd.make_mesh(*mesh_shape)
    task = task_of(config)  # a registered task, or the user's files (kljax.tasks.files)
    task.validate_split(config.task.split)
    splits = ",".join(eval_split_names(config.task, task))  # "" = the data's own: recorded as resolved
    config = config.replace(task=dataclasses.replace(config.task, eval_splits=splits))
    held_out = getattr(task, "held_out", None)
    if held_out and distributed.is_main_process():
        print(f"kljax train: task.eval_fraction={config.task.eval_fraction:g} holds out {held_out[0]} of "
              f"{held_out[1]} rows of {config.task.path} as split 'test' for evaluation (0 trains on all)",
              flush=True)
    functions = reward_functions(config.reward, functions)
    # signatures bound before the model loads
    rewards = RewardSet.build(task, config.reward, functions, config.task.split, guard=reward_guard)
    task.check_run_settings(rl.max_prompt_len, rl.max_new_tokens, config.task.prompt_format)
    num_shards = mesh.shape["data"] * mesh.shape["fsdp"]

    def before_weights(model: Any, tokenizer: Any) -> None:  # the data and sizes, before anything compiles
        transformer = isinstance(model, ModelConfig)
        distributed.check_mesh(mesh_shape, jax.device_count(), rl, model if transformer else None)
        if transformer:
            lora.check_rank(model)  # before an adapter is made
        max_positions = model.max_position_embeddings if transformer else rl.max_prompt_len + rl.max_new_tokens
        check_rl_against_model(rl, max_positions, num_shards)
        dropped = check_prompts(task, config.task, rl, tokenizer, context=max_positions)  # every file row
        if any(dropped.values()) and distributed.is_main_process():
            print(f"kljax train: dropped prompts longer than rl.max_prompt_len={rl.max_prompt_len}: "
                  + ", ".join(f"{n} of split {s!r}" for s, n in dropped.items() if n), flush=True)
        check_train_fits(model, rl)  # a lower bound on the memory, against what the machine has
        run_stops(rl.stop, tokenizer, model)  # rl.stop: an id past the vocabulary, a string no token writes
        if rewards is None:
            check_something_scores(config)  # after the data's own checks, which name a bad file or row first

    policy = load_policy(config.model, mesh, seed=config.seed, task=task, before_weights=before_weights)
    transformer = isinstance(policy.model, ModelConfig)
    reward = reward_from_config(config, task, mesh, policy, rewards)
    optim = config.run_optim
    tx = st.make_optimizer(optim)
    # Two copies of the weights, not three: the state gets its own copy (donated to and updated by
    # every train step), the frozen reference is the loaded one (never donated nor updated; the async
    # snapshots start as the same buffers), or with a 16-bit compute dtype over float32 params its
    # exact half-size copy in the compute dtype (`frozen_copy`), and the policy keeps none.
    lora_base = None
    if transformer and policy.model.lora is not None:  # one copy: the frozen base is policy and reference
        state, state_sh, ref_params, lora_base = _lora_state(policy, tx, mesh, config)
    else:
        state, state_sh = st.state_from_params(policy.params, tx, policy.param_shardings, mesh, config.seed)
        ref_params = policy.params
    if transformer and policy.model.jnp_frozen_dtype != policy.model.jnp_param_dtype:
        ref_params = frozen_copy(ref_params, policy.model)
    exact = task.exact_optimum(policy.model, ref_params)  # None but for a task with a known optimum
    policy = dataclasses.replace(policy, params=None)
    in_update = policy_scored_in_update(rl, config.kl, policy.model)  # then the step reports the KL metrics
    step_settings = StepSettings.from_rl(policy.model, config.kl, rl, kl_metrics=in_update)
    # The XLA-CPU kernels update layer by layer in place (`kernels.cpu.adamw.update_in_place`); plain
    # kernels apply the optax chain itself: the same numbers and the same optimizer state.
    step_tx = optim if transformer and policy.model.cpu_kernels else tx
    step_fn = under_mesh(jax.jit(functools.partial(train_step, settings=step_settings, tx=step_tx),
                                 out_shardings=(state_sh, None), donate_argnums=0), mesh)
    rescore = not sampler_is_policy(rl, config.kl, policy.model) and not in_update
    score_fn = under_mesh(jax.jit(functools.partial(score, model=policy.model, micro_batches=rl.micro_batches,
                                                    full_kl=config.kl.estimator == "full", policy=rescore,
                                                    temperature=rl.policy_temperature)), mesh)
    run = Run(config, policy, task, mesh, tx, state_sh, step_fn, score_fn, reward, exact,
              base=ref_params if lora_base is not None else None, base_identity=lora_base, kl_in_update=in_update)
    return run, state, ref_params


def _lora_state(policy: Policy, tx: Any, mesh: Any, config: RunConfig) -> tuple[Any, Any, Any, dict]:
    """(state over fresh LoRA adapters, its shardings, the base params, the base's identity): the state
    holds only the adapters and their optimizer moments; the loaded weights are the frozen base."""
    model = policy.model
    identity = base_identity(config.model.source, policy.params)
    key = jax.random.fold_in(jax.random.PRNGKey(config.seed), 1)
    state, state_sh = st.create_state(lambda: lora.init_adapters(model, key), tx, st.adapter_shardings(model, mesh),
                                      mesh, config.seed)
    return state, state_sh, policy.params, identity
