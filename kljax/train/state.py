"""Train state, optimizer, and creating both directly in their shardings.

`create_state`: the state's shapes come from `jax.eval_shape`, its
shardings from the model's logical axes, and `jax.jit(init, out_shardings=...)` materializes it
already sharded, so a model too large for one device is never built unsharded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kljax.config.sections import OptimConfig
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.parallel import sharding as shd

Params = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    """params: the policy (with model.lora: only its adapters, `kljax.models.lora`); opt_state: optax
    state; step: int32 scalar; rng: uint32 key data [2]."""

    params: Params
    opt_state: Any
    step: jax.Array
    rng: jax.Array


def learning_rate_schedule(c: OptimConfig) -> optax.Schedule:
    """Linear warmup over c.warmup_steps, then constant, or a cosine / linear decay to
    learning_rate * end_lr_fraction at c.total_steps (which a decay needs: `RunConfig.run_optim`)."""
    if c.schedule != "constant" and c.total_steps is None:
        raise ValueError(f"optim.schedule={c.schedule!r} decays over optim.total_steps, which is None")
    decay_steps = max((c.total_steps or 1) - c.warmup_steps, 1)
    end = c.learning_rate * c.end_lr_fraction
    if c.schedule == "cosine":
        after = optax.cosine_decay_schedule(c.learning_rate, decay_steps, alpha=c.end_lr_fraction)
    elif c.schedule == "linear":
        after = optax.linear_schedule(c.learning_rate, end, decay_steps)
    else:
        after = optax.constant_schedule(c.learning_rate)
    if c.warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, c.learning_rate, c.warmup_steps)
    return optax.join_schedules([warmup, after], [c.warmup_steps])


def last_learning_rate(c: OptimConfig, opt_state: Any, skipped: bool = False) -> float:
    """The learning rate of the last update to `opt_state` (`make_optimizer(c)`'s state): the schedule
    at the count of updates applied before it. A skipped (non-finite) update left the count as it was."""
    counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
              if isinstance(s, optax.ScaleByScheduleState)]
    if not counts:
        return float("nan")
    applied = int(jax.device_get(counts[-1]))
    return float(learning_rate_schedule(c)(max(applied - (0 if skipped else 1), 0)))


def make_optimizer(c: OptimConfig) -> optax.GradientTransformation:
    """optax.chain(clip_by_global_norm(c.max_grad_norm), adamw(...)); no clip when max_grad_norm is None.

    `kljax.kernels.cpu.adamw.update_in_place` applies the same update in place (the train step
    uses it when given the OptimConfig instead of this transformation)."""
    parts = []
    if c.max_grad_norm is not None:
        parts.append(optax.clip_by_global_norm(c.max_grad_norm))
    parts.append(
        optax.adamw(learning_rate_schedule(c), b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay)
    )
    return optax.chain(*parts)


def param_shardings(model_config: ModelConfig, mesh: Mesh) -> Params:
    """NamedSharding pytree for the model's parameters on `mesh` (from their logical axes)."""
    return shd.logical_to_sharding(tfm.logical_axes(model_config), tfm.param_shapes(model_config), mesh)


def adapter_shardings(model_config: ModelConfig, mesh: Mesh) -> Params:
    """NamedSharding pytree of the LoRA adapters (`kljax.models.lora.logical_axes`: A split like its base
    weight's input axes, B like its output axes, the rank axis replicated)."""

    return shd.logical_to_sharding(lora.logical_axes(model_config), lora.adapter_shapes(model_config), mesh)


def trained_shardings(model_config: ModelConfig, mesh: Mesh) -> Params:
    """Shardings of what the train state's params hold: the adapters with model.lora, else every parameter."""
    if model_config.lora is not None:
        return adapter_shardings(model_config, mesh)
    return param_shardings(model_config, mesh)


def state_shardings(
    abstract_state: TrainState, params_sharding: Params, mesh: Mesh, tx: optax.GradientTransformation
) -> TrainState:
    """Shardings for a TrainState: optimizer moments follow their parameters; the rest replicates."""
    rep = NamedSharding(mesh, PartitionSpec())
    opt = optax.tree_map_params(
        tx, lambda _, sharding: sharding, abstract_state.opt_state, params_sharding,
        transform_non_params=lambda _: rep,
    )
    return TrainState(params=params_sharding, opt_state=opt, step=rep, rng=rep)


def _fresh_state(params: Params, tx: optax.GradientTransformation, seed: int) -> TrainState:
    return TrainState(
        params=params,
        opt_state=tx.init(params),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(jax.random.PRNGKey(seed)),
    )


def create_state(
    init_params: Callable[[], Params],
    tx: optax.GradientTransformation,
    params_sharding: Params,
    mesh: Mesh,
    seed: int,
) -> tuple[TrainState, TrainState]:
    """(state, its shardings): built by `jit(init, out_shardings=...)`, never materialized unsharded.

    `init_params()` returns random initial parameters (traced inside the jit).
    """
    init = lambda: _fresh_state(init_params(), tx, seed)
    shardings = state_shardings(jax.eval_shape(init), params_sharding, mesh, tx)
    return jax.jit(init, out_shardings=shardings)(), shardings


def state_from_params(
    params: Params, tx: optax.GradientTransformation, params_sharding: Params, mesh: Mesh, seed: int
) -> tuple[TrainState, TrainState]:
    """A fresh TrainState around already-placed parameters (e.g. a converted HF checkpoint);
    the optimizer state is created inside a jit directly in its shardings.

    The state's parameters are a copy in new buffers, never `params`' own: the train step donates
    them, so `params` stay valid (the trainer keeps them as the frozen reference).
    """
    init = lambda p: _fresh_state(jax.tree.map(jnp.copy, p), tx, seed)
    shardings = state_shardings(jax.eval_shape(init, params), params_sharding, mesh, tx)
    return jax.jit(init, in_shardings=(params_sharding,), out_shardings=shardings)(params), shardings
