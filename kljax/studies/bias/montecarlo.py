"""Monte-Carlo mode: sample batches, estimate each configuration's gradient per batch, repeat.

For each of R repeats, B sequences are drawn from the sampler mu (`policies.sample`: autoregressive
jax.random.categorical, vectorized over the batch) and every configuration's batch estimate
    g_hat_r = (1/B) sum_b grad S_c(theta; y_rb)
is computed with the same `kl_surrogate` as the exact mode. Over the repeats:
    mean         m_hat = (1/R) sum_r g_hat_r
    variance     sum_d Var_r(g_hat_r[d])          (trace of the batch estimate's covariance)
    mse          (1/R) sum_r ||g_hat_r - g*||^2
    bias         ||m_hat - g*|| / ||g*||, with standard error sqrt(variance / R)
    cosine       cos(m_hat, g*);  batch_cosine = (1/R) sum_r cos(g_hat_r, g*)
Repeats are processed `engine.mc_chunk // B` at a time (vmapped), one compiled call per chunk.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kljax.studies.bias.engine import Engine
from kljax.studies.bias.gradients import cosine
from kljax.studies.bias.policies import Behaviour, Params, ToyPolicy, sample

Array = jax.Array

# A bias is "consistent with zero" when ||m_hat - g*|| <= Z * sqrt(variance / R).
UNBIASED_Z = 3.0


@functools.partial(jax.jit, static_argnums=(0, 1))
def sample_jit(policy: ToyPolicy, n: int, behaviour: Behaviour, key: Array) -> Array:
    """n sequences from the sampler, [n, T]."""
    return sample(policy, behaviour, key, n)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def batch_sums(
    policy: ToyPolicy,
    n_configs: int,
    samples: int,
    repeats: int,
    theta: Params,
    seqs_nt: Array,
    cots_kntv: Array,
    truth_d: Array,
    valid_r: Array,
) -> tuple[Array, Array, Array, Array]:
    """For `repeats` batches of `samples` rows (the first repeats * samples sequences; batch r counts
    where valid_r[r] = 1): per config (sum_r g_hat_r [K, D], sum_r g_hat_r**2 [K, D],
    sum_r ||g_hat_r - g*||^2 [K], sum_r cos(g_hat_r, g*) [K])."""
    n = repeats * samples
    seqs_rbt = seqs_nt[:n].reshape(repeats, samples, -1)
    cots = cots_kntv[:n_configs, :n] / samples
    cots_krbtv = cots.reshape(n_configs, repeats, samples, *cots.shape[2:])
    g_norm = jnp.sqrt(jnp.sum(truth_d * truth_d))

    def per_config(cot_rbtv: Array) -> tuple[Array, Array, Array, Array]:
        g_rd = jax.vmap(lambda s, c: policy.grad_params(theta, s, c))(seqs_rbt, cot_rbtv) * valid_r[:, None]
        err_r = jnp.sum((g_rd - truth_d) ** 2, axis=1)
        norm_r = jnp.sqrt(jnp.sum(g_rd * g_rd, axis=1))
        cos_r = jnp.where(norm_r > 0, (g_rd @ truth_d) / jnp.maximum(norm_r * g_norm, 1e-300), 0.0)
        return jnp.sum(g_rd, axis=0), jnp.sum(g_rd * g_rd, axis=0), jnp.sum(err_r * valid_r), jnp.sum(cos_r)

    return jax.lax.map(per_config, cots_krbtv)


@dataclasses.dataclass
class MCResult:
    """Sums over R repeats of B-sample batch estimates, per configuration; `stats()` summarizes."""

    samples: int
    repeats: int
    truth_d: np.ndarray
    sum_kd: np.ndarray
    sum_sq_kd: np.ndarray
    sum_err_k: np.ndarray
    sum_cos_k: np.ndarray

    @property
    def mean_kd(self) -> np.ndarray:
        """m_hat: the mean batch estimate, [K, D]."""
        return self.sum_kd / self.repeats

    @property
    def coord_var_kd(self) -> np.ndarray:
        """Per-coordinate variance of the batch estimate over repeats (ddof 1), [K, D]."""
        r = self.repeats
        return np.maximum(self.sum_sq_kd - r * self.mean_kd**2, 0.0) / max(r - 1, 1)

    def stats(self) -> dict[str, np.ndarray]:
        """relative_bias, bias_stderr (relative), variance, mse, cosine, batch_cosine, relative_rmse,
        unbiased (bias consistent with zero at UNBIASED_Z standard errors); each [K]."""
        g = self.truth_d
        g_norm = float(np.sqrt(g @ g))
        mean = self.mean_kd
        bias = np.sqrt(np.sum((mean - g) ** 2, axis=1))
        variance = np.sum(self.coord_var_kd, axis=1)
        stderr = np.sqrt(variance / self.repeats)
        mse = self.sum_err_k / self.repeats
        return {
            "relative_bias": bias / g_norm,
            "bias_stderr": stderr / g_norm,
            "variance": variance,
            "mse": mse,
            "cosine": cosine(mean, g),
            "batch_cosine": self.sum_cos_k / self.repeats,
            "relative_rmse": np.sqrt(mse) / g_norm,
            "unbiased": bias <= UNBIASED_Z * stderr + 1e-12 * g_norm,
        }


def check_samples(samples: int, repeats: int) -> None:
    """Raise ValueError naming the value and the valid range."""
    if not isinstance(samples, (int, np.integer)) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples={samples!r} must be an integer >= 1 (sequences per batch)")
    if not isinstance(repeats, (int, np.integer)) or isinstance(repeats, bool) or repeats < 2:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 2 (batches, to measure a variance)")


def monte_carlo(
    engine: Engine, behaviour: Behaviour, key: Array, samples: int, repeats: int, length: int | None = None
) -> MCResult:
    """R = `repeats` batches of B = `samples` sequences from the sampler; every configuration's batch
    gradient estimate per batch, summarized against the exact truth grad KL_seq."""
    check_samples(samples, repeats)
    length = engine.check_length(length)
    truth = jnp.asarray(engine.truth(length)["kl_grad"], engine.dtype)
    rows = max(engine.mc_chunk, samples)
    per_call = min(repeats, rows // samples)
    k, d = engine.n_configs, engine.n_params
    sums = [np.zeros((k, d)), np.zeros((k, d)), np.zeros(k), np.zeros(k)]
    done = 0
    for i in range(math.ceil(repeats / per_call)):
        valid = jnp.asarray(np.arange(per_call) < repeats - done, engine.dtype)
        seqs = sample_jit(engine.policy, rows, behaviour, jax.random.fold_in(key, i))
        ps = engine.per_sequence(behaviour, seqs, length)
        parts = batch_sums(engine.policy, k, samples, per_call, engine.setting.theta, seqs, ps.cots_kntv, truth, valid)
        for acc, part in zip(sums, parts, strict=True):
            acc += np.asarray(part, np.float64)
        done += per_call
    return MCResult(samples, repeats, np.asarray(truth, np.float64), *sums)
