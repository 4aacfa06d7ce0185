"""Per-token estimators of the reverse KL divergence KL(pi_theta || pi_ref).

Notation (see docs/kl_math.md): at token t of a response y ~ pi_theta, with prefix h_t,
    d_t   = log pi_theta(y_t|h_t) - log pi_ref(y_t|h_t)       (the log-ratio)
    rho_t = exp(-d_t) = pi_ref(y_t|h_t) / pi_theta(y_t|h_t)
    KL_t(h_t) = KL(pi_theta(.|h_t) || pi_ref(.|h_t)),   KL_seq = E[sum_t d_t] = E[sum_t KL_t(h_t)].

Every estimator maps a log-ratio array of any shape `[...]` to per-token values of the same shape.
Masking and reduction are the caller's (see `losses.aggregate`). Values are computed in at least
float32, whatever the model's dtype (bf16 log-ratios lose the small differences that matter).

The gradient an estimator gives depends on where it is placed (reward: score function only; loss:
pathwise only; both); `kljax.rl.kl` composes them and `kljax.verdicts.kl.describe` states the result.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def as_float(x: Array) -> Array:
    """Promote to at least float32 (float64 stays float64)."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def log_ratio(logp: Array, ref_logp: Array) -> Array:
    """d = log pi_theta - log pi_ref, in at least float32. Shapes `[...]` -> `[...]`."""
    return as_float(logp) - as_float(ref_logp)


def k1(d: Array) -> Array:
    """k1 = d.

    Value: E_{y_t~pi}[k1] = KL_t (unbiased), high variance, negative about half the time.
    Gradient in loss (pathwise): grad d_t = grad log pi(y_t|h_t), zero mean: no regularization.
    In reward (score function, sequence sum): exactly grad KL_seq (the recommended default).
    """
    return as_float(d)


def k2(d: Array) -> Array:
    """k2 = d**2 / 2.

    Value: biased (E[k2] != KL_t in general), low variance, >= 0.
    Gradient in loss, per token: d_t grad log pi(y_t|h_t), whose expectation at a fixed prefix is
    grad KL_t: the "partial" reverse KL that misses each token's effect on future tokens.
    Applied to the sequence sum D = sum_t d_t ("sequence scope"), (D**2/2) in loss gives
    D grad log pi(y|x): exactly grad KL_seq.
    """
    d = as_float(d)
    return 0.5 * d * d


def k3(d: Array) -> Array:
    """k3 = rho - 1 + d = expm1(-d) + d   (verl/TRL "low_var_kl").

    Value: unbiased (E[rho] = 1), >= 0, low variance near d = 0. Computed with expm1, and with
    its Taylor series for |d| < 0.25, so that small d keeps full float32 relative precision; for
    d < -88 exp overflows float32 to inf (a log-ratio that large means the reference gives the
    token e^88 times the policy's probability).
    Gradient in loss, per token: (1 - rho_t) grad log pi, expectation at a fixed prefix
    -sum_v pi_ref(v) grad log pi(v) = grad KL(pi_ref || pi_theta)(h_t): a partial *forward* KL.
    In reward: neither the reverse nor the forward KL gradient.
    """
    d = as_float(d)
    if d.dtype == jnp.float64:  # exact enumerations: expm1's cancellation error (~1e-16/|d|) is negligible
        return jnp.expm1(-d) + d
    # In float32, expm1(-d) + d still cancels its leading term (relative error ~ 2 eps / |d|); below
    # |d| = 0.25 the Taylor series sum_{n=2..6} (-d)^n / n! (relative error < 4e-7) is used instead.
    series = d * d * (1 / 2 + d * (-1 / 6 + d * (1 / 24 + d * (-1 / 120 + d / 720))))
    return jnp.where(jnp.abs(d) < 0.25, series, jnp.expm1(-d) + d)


def k3_plus(d: Array) -> Array:
    """"k3+" straight-through (verl): the value of k3 with the gradient of k2.

    k3_plus = k2(d) + stop_gradient(k3(d) - k2(d)). In loss its gradient is k2's (the partial
    reverse KL); in reward it behaves like k3.
    """
    return k2(d) + jax.lax.stop_gradient(k3(d) - k2(d))


# Sample-based estimators by config name. The full-vocabulary KL ("full") needs both models'
# logits, not one log-ratio, and is computed by `full_kl_from_logits` below.
SAMPLE_ESTIMATORS: dict[str, Callable[[Array], Array]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "k3+": k3_plus,
}
ESTIMATOR_NAMES: tuple[str, ...] = (*SAMPLE_ESTIMATORS, "full")


def sample_estimator(name: str) -> Callable[[Array], Array]:
    """Look up a sample-based estimator by name; unknown names list the valid ones."""
    try:
        return SAMPLE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown KL estimator {name!r}; valid sample estimators: {sorted(SAMPLE_ESTIMATORS)}"
        ) from None


def full_kl_from_logits(logits_btv: Array, ref_logits_btv: Array) -> Array:
    """Exact per-prefix KL_t = sum_v pi(v|h_t) (log pi(v|h_t) - log pi_ref(v|h_t)).

    Shapes: [B, T, V], [B, T, V] -> [B, T]. Zero variance at a prefix; its gradient is
    grad_theta KL_t at the fixed prefix (the partial reverse KL). Holds [B, T, V] float32 arrays:
    for long sequences the train step forms it in chunks (`transformer_policy.full_kl_from_hidden`).
    """
    logp_btv = jax.nn.log_softmax(as_float(logits_btv), axis=-1)
    ref_logp_btv = jax.nn.log_softmax(as_float(ref_logits_btv), axis=-1)
    return jnp.sum(jnp.exp(logp_btv) * (logp_btv - ref_logp_btv), axis=-1)
