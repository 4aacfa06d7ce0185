"""Toy RL settings: a reference policy, the current policy theta after a few optimizer steps of a toy
reward + KL objective, and behaviour (sampler) policies at a controlled distance from theta.

The toy task rewards following a pattern: R(y) = (1/T) sum_t [y_t == t mod V], in [0, 1]. theta is
trained by exact gradient ascent (every sequence enumerated) on
    J(theta) = E_{y~pi_theta}[R(y)] - beta * KL_seq(pi_theta || pi_ref),
starting from theta_0 = ref + drift * (random policy), with SGD or Adam. The parameters of the last
`max_staleness + 1` steps are kept: the sampler "stale by N steps" is theta from N steps earlier,
which is how an asynchronous trainer's rollouts lag behind the learner.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from kljax.studies.bias.gradients import toy_reward_masked
from kljax.studies.bias.policies import Behaviour, Params, ToyPolicy, enumerate_sequences, sequence_logps

Array = jax.Array
OPTIMIZERS = ("sgd", "adam")


def toy_reward(seqs_nt: Array, vocab: int) -> Array:
    """R(y) = fraction of positions with y_t == t mod V: [N] in [0, 1]."""
    return toy_reward_masked(seqs_nt, jnp.ones(seqs_nt.shape, jnp.float32), vocab)


def exact_objective(
    policy: ToyPolicy, params: Params, ref: Params, seqs_nt: Array, reward_n: Array, beta: float
) -> Array:
    """J = sum_y pi(y) R(y) - beta * sum_y pi(y) log(pi(y)/pi_ref(y)), over all sequences seqs_nt."""
    logp_n = jnp.sum(sequence_logps(policy.logits(params, seqs_nt), seqs_nt), axis=1)
    ref_n = jnp.sum(sequence_logps(policy.logits(ref, seqs_nt), seqs_nt), axis=1)
    p_n = jnp.exp(logp_n)
    return jnp.sum(p_n * reward_n.astype(p_n.dtype)) - beta * jnp.sum(p_n * (logp_n - ref_n))


@functools.lru_cache(maxsize=32)
def make_optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
    """optax SGD or Adam; cached, so equal settings reuse one compiled training loop."""
    if name == "sgd":
        return optax.sgd(learning_rate)
    if name == "adam":
        return optax.adam(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}; valid optimizers: {list(OPTIMIZERS)}")


def train_history(
    policy: ToyPolicy, theta0: Params, ref: Params, beta: float, steps: int, optimizer: optax.GradientTransformation
) -> Params:
    """Exact-gradient ascent on J for `steps` steps; returns the stacked parameters of every step,
    newest first: leaves [steps + 1, ...], entry i = theta from i steps before the final one."""
    seqs = enumerate_sequences(policy)
    reward = toy_reward(seqs, policy.vocab)
    loss = lambda p: -exact_objective(policy, p, ref, seqs, reward, beta)

    def step(carry: tuple[Params, optax.OptState], _: None) -> tuple[tuple[Params, optax.OptState], Params]:
        params, state = carry
        updates, state = optimizer.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
        return (params, state), params

    _, trail = jax.lax.scan(step, (theta0, optimizer.init(theta0)), None, length=steps)
    history = jax.tree_util.tree_map(lambda first, rest: jnp.concatenate([first[None], rest]), theta0, trail)
    return jax.tree_util.tree_map(lambda x: jnp.flip(x, axis=0), history)


@dataclasses.dataclass(frozen=True)
class Setting:
    """A study setting. history: stacked params, entry i = theta from i optimizer steps earlier
    (entry 0 = theta); other: a random policy for logit-space interpolation."""

    policy: ToyPolicy
    ref: Params
    history: Params
    other: Params
    beta: float

    @property
    def theta(self) -> Params:
        return jax.tree_util.tree_map(lambda x: x[0], self.history)

    @property
    def max_staleness(self) -> int:
        return int(jax.tree_util.tree_leaves(self.history)[0].shape[0]) - 1

    def stale(self, steps: int) -> Behaviour:
        """The sampler stale by `steps` optimizer steps (0: on-policy)."""
        if not 0 <= steps <= self.max_staleness:
            raise ValueError(f"staleness={steps} is out of range: this setting keeps 0..{self.max_staleness} steps")
        return Behaviour(jax.tree_util.tree_map(lambda x: x[steps], self.history))

    def interpolated(self, alpha: float) -> Behaviour:
        """mu_logits = theta_logits + alpha * (other_logits - theta_logits)."""
        return Behaviour(self.theta, self.other, jnp.asarray(alpha, jax.tree_util.tree_leaves(self.ref)[0].dtype))


def make_setting(
    policy: ToyPolicy,
    seed: int = 0,
    *,
    drift: float = 0.5,
    train_steps: int = 20,
    max_staleness: int = 8,
    beta: float = 0.1,
    learning_rate: float = 0.1,
    optimizer: str = "adam",
    dtype=jnp.float64,
) -> Setting:
    """ref ~ random policy (NumPy draws seeded by `seed`); theta_0 = ref + drift * random; then
    `train_steps` steps of `optimizer` on the toy reward + beta * KL objective; keeps the last
    `max_staleness + 1` parameter sets."""
    if train_steps < max_staleness:
        raise ValueError(f"train_steps={train_steps} must be >= max_staleness={max_staleness}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness} must be >= 0")
    rng_ref, rng_theta, rng_other = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    ref = policy.init(rng_ref, dtype)
    theta0 = policy.perturb(rng_theta, ref, drift)
    other = policy.init(rng_other, dtype)
    history = jax.jit(train_history, static_argnums=(0, 4, 5))(
        policy, theta0, ref, beta, train_steps, make_optimizer(optimizer, learning_rate)
    )
    history = jax.tree_util.tree_map(lambda x: x[: max_staleness + 1], history)
    return Setting(policy, ref, history, other, beta)


def stack_behaviours(behaviours: list[Behaviour]) -> Behaviour:
    """Stack samplers along a new leading axis (for vmap over staleness or alpha)."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *behaviours)
