"""95% intervals for evaluation accuracies, and for the paired change between two evaluations.

    wilson_interval(successes, n)               greedy: one 0/1 outcome per problem (Wilson score interval)
    cluster_bootstrap_interval(values_pk, seed) k samples per problem: the problem is the unit
    paired_change(before_pk, after_pk, seed)    the same problems before and after: {"diff", "ci95"}
    accuracy_entry(correct_pk, seed)            {"accuracy", "ci95": [lo, hi], "n"} (n: problems)

Wilson: with p = s/n and z the normal quantile, the interval is
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n).
Samples of one problem are correlated (an easy problem is right in all k), so k samples of P problems
are not P k independent trials: the cluster bootstrap resamples problems with replacement (all k
samples of a drawn problem together) and takes the 2.5% and 97.5% quantiles of the resampled mean.
When every problem has the same mean (all wrong, say) the resamples cannot vary; the interval is
then Wilson's on P problems (each problem one trial), an upper bound for the correlation. The paired
change resamples the differences d_i = mean_k(after_ik) - mean_k(before_ik) the same way. Seeded throughout.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal
N_BOOT = 2000


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for `successes` of `n` Bernoulli trials (see the module docstring)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    scale = 1 + z2 / n
    lo = 0.0 if successes == 0 else (centre - half) / scale  # exact ends where float rounding would miss them
    hi = 1.0 if successes == n else (centre + half) / scale
    return lo, hi


def _problem_means(values_pk: np.ndarray) -> np.ndarray:
    values_pk = np.asarray(values_pk, np.float64)
    if values_pk.ndim == 1:
        values_pk = values_pk[:, None]
    if values_pk.ndim != 2 or values_pk.shape[0] < 1 or values_pk.shape[1] < 1:
        raise ValueError(f"values must be [problems, samples] with at least one of each, got {values_pk.shape}")
    return values_pk.mean(axis=1)


def _bootstrap_means(m_p: np.ndarray, seed: int, n_boot: int) -> np.ndarray:
    """[n_boot] means of m_p over problems drawn with replacement (a seeded generator)."""
    rng = np.random.default_rng(seed)
    idx_bp = rng.integers(0, m_p.shape[0], size=(n_boot, m_p.shape[0]))
    return m_p[idx_bp].mean(axis=1)


def _quantiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def cluster_bootstrap_interval(values_pk: np.ndarray, seed: int = 0, n_boot: int = N_BOOT,
                               level: float = 0.95) -> tuple[float, float]:
    """Interval for the mean of values_pk [P, k] in [0, 1] (k samples of P problems), the problem the
    unit (see the module docstring; Wilson on P problems when every problem has the same mean)."""
    m_p = _problem_means(values_pk)
    if np.all(m_p == m_p[0]) and m_p[0] in (0.0, 1.0):
        return wilson_interval(int(m_p[0]) * m_p.shape[0], m_p.shape[0], z=_z(level))
    return _quantiles(_bootstrap_means(m_p, seed, n_boot), level)


def paired_change(before_pk: np.ndarray, after_pk: np.ndarray, seed: int = 0, n_boot: int = N_BOOT,
                  level: float = 0.95) -> dict[str, float | list[float]]:
    """{"diff": mean after - mean before, "ci95": [lo, hi]} for the same P problems (row i of both is
    problem i), the problems resampled together (see the module docstring)."""
    before_p, after_p = _problem_means(before_pk), _problem_means(after_pk)
    if before_p.shape != after_p.shape:
        raise ValueError(f"a paired change needs the same problems before and after: {before_p.shape[0]} "
                         f"problems before, {after_p.shape[0]} after")
    d_p = after_p - before_p
    lo, hi = _quantiles(_bootstrap_means(d_p, seed, n_boot), level)
    return {"diff": float(d_p.mean()), "ci95": [lo, hi]}


def accuracy_entry(correct_pk: np.ndarray, seed: int = 0, n_boot: int = N_BOOT) -> dict[str, float | int | list]:
    """{"accuracy", "ci95": [lo, hi], "n": problems} of correct_pk [P] or [P, k] (bool or 0/1):
    Wilson when there is one outcome per problem, the cluster bootstrap for k > 1."""
    correct_pk = np.asarray(correct_pk, np.float64)
    m_p = _problem_means(correct_pk)
    k = 1 if correct_pk.ndim == 1 else correct_pk.shape[1]
    if k == 1:
        lo, hi = wilson_interval(int(round(m_p.sum())), m_p.shape[0])
    else:
        lo, hi = cluster_bootstrap_interval(correct_pk, seed, n_boot)
    return {"accuracy": float(m_p.mean()), "ci95": [lo, hi], "n": int(m_p.shape[0])}


def _z(level: float) -> float:
    """The normal quantile for a two-sided `level` interval (Z95 for 0.95)."""
    return Z95 if level == 0.95 else NormalDist().inv_cdf((1 + level) / 2)
