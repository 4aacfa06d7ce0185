"""A finished or running `kljax train` WORKDIR read back: its config and a checkpoint's policy.

    config = run_config_of(workdir)                          # WORKDIR/config.json (+ overrides)
    params, policy, config, step = restore_params(workdir)   # the latest checkpoint (or `step`)

The checkpoint tree is {"train": TrainState, "snapshots": [params] * rl.async_level}; the abstract
target comes from `jax.eval_shape`, so nothing but the restored arrays is materialized. A latest
checkpoint that a running job rotates away while it is read is retried with the new latest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from kljax.config.load import with_fields, with_overrides
from kljax.config.run import RunConfig
from kljax.errors import UserError, read_json
from kljax.models import lora
from kljax.models.base_identity import base_identity, check_same_base
from kljax.parallel import sharding as shd
from kljax.tasks.toy_optimum import ToyOptimumTask
from kljax.train import state as st
from kljax.train.checkpoint import RunCheckpointer
from kljax.train.checkpoint_shapes import CheckpointGone
from kljax.train.policy import Policy, load_policy


def make_mesh(config: RunConfig) -> Any:
    """The run config's (data, fsdp, tensor) mesh; if it does not fit the devices here, all devices on fsdp."""
    try:
        return shd.make_mesh(*config.mesh.shape)
    except ValueError:
        return shd.make_mesh(1, -1, 1)


def load_model(config: RunConfig, mesh: Any) -> Policy:
    """The policy of config.model ("tiny", "default" or an HF checkpoint dir), its params initialized or read."""
    return load_policy(config.model, mesh, seed=config.seed)


def run_config_of(workdir: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The run config of a `kljax train` WORKDIR (its config.json, then `overrides`); a UserError for
    a directory that is no workdir or a run of the toy task (measured exactly, not evaluated)."""
    workdir = Path(workdir)
    path = workdir / "config.json"
    if not path.exists():
        raise UserError(f"{workdir} has no config.json: is it a `kljax train` workdir?")
    raw = read_json(path, "run config")
    if not isinstance(raw, dict):
        raise UserError(f"run config {path} holds a {type(raw).__name__}, not a JSON object")
    config = with_fields(RunConfig(), raw, f"run config {str(path)!r}")
    if config.task.name == ToyOptimumTask.name:
        raise UserError(f"{workdir} is a run of the toy task {ToyOptimumTask.name!r}, measured exactly: its "
                        "metrics.jsonl holds exact/gap, exact/J, ... at every step (exact_before.json at pi_ref) "
                        f"and `kljax plot-run {workdir}` draws them; eval, generate and export take runs of "
                        "text tasks")
    return with_overrides(config, list(overrides))


def restore_params(workdir: str | Path, step: int | None = None, mesh: Any = None,
                   overrides: Sequence[str] = ()) -> tuple[Any, Policy, RunConfig, int]:
    """(params, policy, run config, step) of a WORKDIR's checkpoint (default: the latest); `overrides`
    ("--config.field=value") change WORKDIR/config.json first (e.g. the mesh or dtype)."""
    workdir = Path(workdir)
    config = run_config_of(workdir, overrides)
    mesh = mesh if mesh is not None else make_mesh(config)
    policy = load_model(config, mesh)
    ckpt = RunCheckpointer(workdir / "checkpoints", config.keep_checkpoints)
    requested = step
    try:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise UserError(f"{workdir / 'checkpoints'} holds no checkpoint yet")
        if step not in ckpt.all_steps():
            raise UserError(f"no checkpoint at step {step} in {workdir}; available: {ckpt.all_steps()}")
        tx = st.make_optimizer(config.run_optim)
        lora_model = getattr(policy.model, "lora", None) is not None  # the state holds adapters over the base
        if lora_model:
            trained, trained_sh = lora.adapter_shapes(policy.model), st.adapter_shardings(policy.model, mesh)
        else:
            trained, trained_sh = jax.eval_shape(lambda p: p, policy.params), policy.param_shardings
        abstract_state = jax.eval_shape(
            lambda p: st.TrainState(p, tx.init(p), jnp.zeros((), jnp.int32),
                                    jax.random.key_data(jax.random.PRNGKey(0))), trained)
        state_sh = st.state_shardings(abstract_state, trained_sh, mesh, tx)
        n_snap = config.rl.async_level
        like = {"train": abstract_state, "snapshots": [trained] * n_snap}
        shardings = {"train": state_sh, "snapshots": [trained_sh] * n_snap}
        for attempt in range(3):  # the latest, rotated away by a running job while read: the new latest
            try:
                restored, meta = ckpt.restore(step, like, shardings)
                break
            except CheckpointGone:
                if requested is not None or attempt == 2 or ckpt.latest_step() is None:
                    raise
                step = ckpt.latest_step()
    finally:
        ckpt.close()
    params = restored["train"].params
    if lora_model:  # adapters only apply to the base they were trained on
        check_same_base(meta.get("lora_base"), base_identity(config.model.source, policy.params),
                        f"checkpoint at step {step} in {workdir}")
        params = lora.combine(policy.params, params)
    return params, dataclasses.replace(policy, params=params), config, int(step)
