"""The update of `state.make_optimizer(c)`, written so that XLA runs it in place.

`make_optimizer(c)` is optax.chain(clip_by_global_norm(c.max_grad_norm), adamw(...)). Through `tx.update`
and `optax.apply_updates`, XLA CPU computes each leaf's new parameter and moments in separate loops from
the old moments, so it copies those and keeps the clipped gradient: three parameter-sized temporaries per
step (docs/performance.md). `update_in_place` makes two passes over the stacked [L, ...] layer parameters,
one layer per `lax.fori_loop` iteration: the first writes the new moments over the old, the second reads
them and writes the new parameters (a loop boundary keeps XLA from re-deriving the moments there). The
leaves without a layer axis are updated whole; the layer axis is never sharded (no communication).
Per element, with count the step count before this update and t = count + 1 (optax's adamw, eps_root = 0):
    g   <- g                          if ||G||_2 < max_norm,   else g / ||G||_2 * max_norm
    mu' = (1 - b1) g + b1 mu,         nu' = (1 - b2) g^2 + b2 nu
    p'  = p + (-lr(count)) * ((mu' / (1 - b1^t)) / (sqrt(nu' / (1 - b2^t)) + eps) + wd p)
and nothing changes, the counts included, where `apply` is False (a non-finite step). optax's state
layout is kept.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from kljax.config.sections import OptimConfig

Params = Any
LAYERS = "layers"


def split_layers(tree: Params) -> tuple[Params, Params | None]:
    """(everything but tree['layers'], tree['layers'] or None): the stacked [L, ...] layer leaves apart."""
    if isinstance(tree, dict) and LAYERS in tree:
        return {k: v for k, v in tree.items() if k != LAYERS}, tree[LAYERS]
    return tree, None


def join_layers(rest: Params, layers: Params | None) -> Params:
    """The inverse of `split_layers`."""
    return rest if layers is None else {**rest, LAYERS: layers}


def _per_layer(fn: Any, carry: Params, *inputs: Params) -> Params:
    """carry with fn applied one layer at a time: carry[i] <- fn(carry[i], inputs[i]...) for each
    layer i, in a fori_loop that writes each layer back in place (all leaves have [L, ...])."""
    at = lambda tree, i: jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), tree)

    def body(i: jax.Array, c: Params) -> Params:
        new = fn(at(c, i), *(at(x, i) for x in inputs))
        return jax.tree.map(lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, i, 0), c, new)

    return jax.lax.fori_loop(0, jax.tree.leaves(carry)[0].shape[0], body, carry)


class _Leaf:
    """The per-element AdamW update of the module docstring, for one optimizer step."""

    def __init__(self, c: OptimConfig, schedule: optax.Schedule, t: jax.Array, lr_count: jax.Array,
                 grad_norm: jax.Array) -> None:
        self.c = c
        self.bc1, self.bc2 = 1 - c.b1 ** t, 1 - c.b2 ** t
        self.step_size = -schedule(lr_count)
        self.norm = grad_norm.astype(jnp.float32)

    def clip_factor(self) -> jax.Array:
        """The clip as one float32 scalar: 1 if ||G||_2 < max_norm (or no clip), else max_norm / ||G||_2."""
        if self.c.max_grad_norm is None:
            return jnp.ones((), jnp.float32)
        return jnp.where(self.norm < self.c.max_grad_norm, 1.0, self.c.max_grad_norm / self.norm)

    def clip(self, g: jax.Array) -> jax.Array:
        """g as optax's clip_by_global_norm leaves it: g, or g / ||G||_2 * max_norm."""
        c = self.c
        if c.max_grad_norm is None:
            return g
        return jax.lax.select(self.norm < c.max_grad_norm, g, (g / self.norm.astype(g.dtype)) * c.max_grad_norm)

    def moments(self, mu: jax.Array, nu: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(mu', nu') for the clipped gradient g."""
        c = self.c
        return (1 - c.b1) * g + c.b1 * mu, ((1 - c.b2) * g ** 2 + c.b2 * nu).astype(nu.dtype)

    def parameter(self, p: jax.Array, mu: jax.Array, nu: jax.Array) -> jax.Array:
        c = self.c
        u = (mu / self.bc1.astype(mu.dtype)) / (jnp.sqrt(nu / self.bc2.astype(nu.dtype)) + c.eps)
        if c.weight_decay:
            u = u + c.weight_decay * p
        return jnp.asarray(p + jnp.asarray(self.step_size, u.dtype) * u).astype(p.dtype)


def _adam(c: OptimConfig, schedule: optax.Schedule, opt_state: Any, grad_norm: jax.Array
          ) -> tuple[Any, Any, Any, list, jax.Array, _Leaf]:
    *clip_state, adam_state = opt_state
    if len(adam_state) != 3 or not isinstance(adam_state[0], optax.ScaleByAdamState):
        raise TypeError("opt_state is not the state of state.make_optimizer (chain(clip, adamw))")
    scale, decay_state, lr_state = adam_state
    t = optax.safe_increment(scale.count)
    return scale, decay_state, lr_state, clip_state, t, _Leaf(c, schedule, t, lr_state.count, grad_norm)


def tree_all_finite(tree: Any) -> jax.Array:
    """True (bool scalar) when every element of every leaf of `tree` is finite."""
    oks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(oks)) if oks else jnp.asarray(True)


def update_is_finite(c: OptimConfig, schedule: optax.Schedule, grads: Params, opt_state: Any, params: Params,
                     grad_norm: jax.Array) -> jax.Array:
    """Whether `update_in_place`'s new parameters and moments would all be finite (bool scalar),
    computed as reductions, without writing them. False discards the step like a non-finite loss.

    Each leaf is one `all` over one elementwise expression, with the clip as a scalar factor (equal
    to the update's `g / ||G|| * max_norm` up to rounding): XLA then fuses it all into the reduce
    and adds no parameter-sized temporary to the step. A division shared by the moments, or an
    `all` per array, made it write the new moments or their masks out first (docs/performance.md)."""
    scale, *_, leaf = _adam(c, schedule, opt_state, grad_norm)
    clip = leaf.clip_factor()

    def one(p: jax.Array, mu: jax.Array, nu: jax.Array, g: jax.Array) -> jax.Array:
        new_mu, new_nu = leaf.moments(mu, nu, g * clip.astype(g.dtype))
        new_p = leaf.parameter(p, new_mu, new_nu)
        return jnp.all(jnp.isfinite(new_p) & jnp.isfinite(new_mu) & jnp.isfinite(new_nu))

    oks = jax.tree.leaves(jax.tree.map(one, params, scale.mu, scale.nu, grads))
    return jnp.all(jnp.stack(oks)) if oks else jnp.asarray(True)


def update_in_place(
    c: OptimConfig, schedule: optax.Schedule, grads: Params, opt_state: Any, params: Params, grad_norm: jax.Array,
    apply: jax.Array,
) -> tuple[Params, Any]:
    """(new params, new optimizer state) of `make_optimizer(c)` for `grads` (module docstring).

    schedule: `train.state.learning_rate_schedule(c)`; opt_state: the state `make_optimizer(c).init` made;
    grad_norm: ||grads||_2 (the clip's norm);
    apply: bool scalar, False to return params and state unchanged. Equal to `tx.update` and
    `optax.apply_updates` on the whole tree up to float rounding (tests/test_cpu_adamw.py).
    """
    scale, decay_state, lr_state, clip_state, t, leaf = _adam(c, schedule, opt_state, grad_norm)
    count = scale.count

    def moments(mn: tuple[Params, Params], g: Params) -> tuple[Params, Params]:
        def one(mu, nu, g):
            new_mu, new_nu = leaf.moments(mu, nu, leaf.clip(g))
            return jnp.where(apply, new_mu, mu), jnp.where(apply, new_nu, nu)

        if not jax.tree.leaves(g):  # nothing outside the layers (LoRA adapters: layers only)
            return mn
        out = jax.tree.map(one, *mn, g)
        return jax.tree.transpose(jax.tree.structure(g), jax.tree.structure((0, 0)), out)

    def parameters(p: Params, mu: Params, nu: Params) -> Params:
        return jax.tree.map(lambda p, mu, nu: jnp.where(apply, leaf.parameter(p, mu, nu), p), p, mu, nu)

    g_o, g_l = split_layers(grads)
    p_o, p_l = split_layers(params)
    mu_o, mu_l = split_layers(scale.mu)
    nu_o, nu_l = split_layers(scale.nu)
    mu_o, nu_o = moments((mu_o, nu_o), g_o)
    p_o = parameters(p_o, mu_o, nu_o)
    if p_l is not None:
        mu_l, nu_l = _per_layer(moments, (mu_l, nu_l), g_l)
        p_l = _per_layer(parameters, p_l, mu_l, nu_l)
    keep = lambda new, old: jnp.where(apply, new, old)
    new_scale = optax.ScaleByAdamState(count=keep(t, count), mu=join_layers(mu_o, mu_l),
                                       nu=join_layers(nu_o, nu_l))
    new_lr_state = lr_state._replace(count=keep(optax.safe_increment(lr_state.count), lr_state.count))
    return join_layers(p_o, p_l), (*clip_state, (new_scale, decay_state, new_lr_state))
