"""The convergence study: every KL preset (and no KL) x beta x seeds x sampler staleness, trained by
the trainer's own update on a toy task (`converge.train_runs`) and measured against the exact
optimum pi* and the configuration's own fixed point (`fixed_point.find_fixed_points`).

Per row (preset, async_level, beta) over the seeds: the gap = beta KL(pi || pi*) at every step,
its initial and final value, where the run ended (`classify`) and whether it was unstable
(`unstable`, rule in UNSTABLE_RULE).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.policies.transformer import TransformerPolicy
from kljax.rl.kl import KLConfig
from kljax.studies.converge import RunSettings, train_runs
from kljax.studies.fixed_point import FixedPoint, find_fixed_points
from kljax.tasks.exact_optimum import SHAPES, ToyTask, exact_metrics, make_task, task_logps
from kljax.verdicts.kl import describe
from kljax.verdicts.objective import RunObjective, describe_objective
from kljax.verdicts.presets import PRESETS

UNSTABLE_RULE = ("a row is unstable when any seed made a non-finite update, or its mean final gap exceeds the "
                 "initial gap (training moved away from pi*), or the gap rises again: over the last 20% of "
                 "steps the seed-mean gap climbs above its running minimum by more than half of max(the "
                 "tail's mean, 2% of the initial gap)")
CONVERGED_RULE = ("'pi*': mean final gap <= 2% of the initial gap; else 'fixed point' (or 'boundary' where the "
                  "expected-gradient ascent found no finite fixed point: logits growing without bound) when "
                  "beta KL(pi_final || pi_fp) averaged over seeds is below half the final gap and the fixed point "
                  "is not pi*; else 'diverged' when unstable, else 'not converged'")
QUICK_PRESETS = ("none", "k1-reward", "k3-loss", "k1-loss")
TRANSFORMER = ModelConfig(architecture="LlamaForCausalLM", vocab_size=3, hidden_size=32, intermediate_size=64,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=16)


def preset_configs() -> dict[str, KLConfig]:
    """name -> KLConfig of every `kljax kl-configs` preset (no KL included, as 'none')."""
    return {describe(c).name: c for c, _ in PRESETS}


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    presets: tuple[str, ...]
    betas: tuple[float, ...] = (0.05, 0.1, 0.3, 1.0)
    seeds: int = 5
    async_levels: tuple[int, ...] = (0, 4, 10)
    steps: int = 300
    group_size: int = 8
    learning_rate: float = 0.1
    shapes: tuple[str, ...] = SHAPES
    vocab: int = 3
    response_len: int = 3
    task_seed: int = 0
    policy: str = "tabular"
    fixed_point_iters: int = 4000  # 0: no fixed points (their fields are NaN)

    POLICIES = ("tabular", "transformer")

    def __post_init__(self) -> None:
        valid = preset_configs()
        bad = [p for p in self.presets if p not in valid]
        if bad or not self.presets:
            raise ValueError(f"presets {bad or 'none given'} not valid; choose from {sorted(valid)}")
        if self.policy not in self.POLICIES:
            raise ValueError(f"policy {self.policy!r} is not valid; choose one of {list(self.POLICIES)}")
        if any(not b > 0 for b in self.betas) or self.seeds < 1 or any(a < 0 for a in self.async_levels):
            raise ValueError(f"betas {self.betas} must be > 0, seeds {self.seeds} >= 1, "
                             f"async levels {self.async_levels} >= 0")

    @classmethod
    def full(cls) -> StudyConfig:
        return cls(tuple(preset_configs()))

    @classmethod
    def quick(cls) -> StudyConfig:
        return cls(QUICK_PRESETS, seeds=2, async_levels=(0, 4), steps=200)

    def task(self) -> ToyTask:
        """The toy task on the tabular policy, or on a 2-layer random transformer over the same
        V tokens (TRANSFORMER, init std 0.3, so pi_ref is not near-uniform)."""
        if self.policy == "tabular":
            return make_task(self.shapes, self.vocab, self.response_len, seed=self.task_seed)

        model = dataclasses.replace(TRANSFORMER, vocab_size=max(self.vocab, len(self.shapes)))
        ref = tfm.init_params(model, jax.random.PRNGKey(self.task_seed), std=0.3)
        return make_task(self.shapes, self.vocab, self.response_len, policy=TransformerPolicy(model), ref_params=ref)


def unstable(gap_ts: np.ndarray, nonfinite_ts: np.ndarray) -> str:
    """'' when stable, else the reason (UNSTABLE_RULE); gap_ts, nonfinite_ts: [steps + 1, seeds]."""
    if np.any(nonfinite_ts > 0) or not np.all(np.isfinite(gap_ts)):
        return "non-finite update"
    mean = gap_ts.mean(axis=1)
    if mean[-1] > mean[0]:
        return "moved away from pi*"
    tail = mean[-max(2, len(mean) // 5):]
    if np.max(tail - np.minimum.accumulate(tail)) > 0.5 * max(tail.mean(), 0.02 * mean[0]):
        return "rises again"
    return ""


def classify(initial: float, final: float, dist_fp: float, fp_gap: float, fp_boundary: bool, why_unstable: str) -> str:
    """Where a row ended (CONVERGED_RULE)."""
    if np.isfinite(final) and final <= 0.02 * initial:
        return "pi*"
    if np.isfinite(dist_fp) and dist_fp < 0.5 * final and fp_gap > 0.02 * initial:
        return "boundary" if fp_boundary else "fixed point"
    return "diverged" if why_unstable else "not converged"


def _beta_kl(logp_pn: Any, logq_pn: Any, beta: float) -> float:
    p = np.exp(np.asarray(logp_pn, np.float64))
    diff = np.asarray(logp_pn, np.float64) - np.asarray(logq_pn, np.float64)
    return float(beta * np.mean(np.sum(np.where(p > 0, p * diff, 0.0), axis=-1)))


def run_study(cfg: StudyConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """{"meta", "rows", "curves"}: rows as described in the module docstring; curves[name] =
    {"gap": [steps + 1, seeds], "kl_seq": ..., "reward": ...} numpy arrays. `progress(label)` is
    called after each (preset, async level) program."""
    task, configs = cfg.task(), preset_configs()
    betas, seeds = np.asarray(cfg.betas), np.arange(cfg.seeds)
    ref_logp = task_logps(task, task.ref_params)
    rows, curves, t0 = [], {}, time.perf_counter()
    fixed = {}
    for name in cfg.presets if cfg.fixed_point_iters else ():
        fp = find_fixed_points(task, configs[name], betas, iters=cfg.fixed_point_iters)
        logps = [task_logps(task, jax.tree.map(lambda x, i=i: x[i], fp.params)) for i in range(len(betas))]
        fixed[name] = (fp, logps)
    nan_logp = jax.numpy.full_like(ref_logp, float("nan"))
    no_fp = (FixedPoint(None, np.zeros(len(betas), bool), np.full(len(betas), np.nan), np.full(len(betas), np.nan)),
             [nan_logp] * len(betas))
    for name in cfg.presets:
        kl = configs[name]
        fp, fp_logps = fixed.get(name, no_fp)
        for level in cfg.async_levels:
            run = RunSettings(steps=cfg.steps, group_size=cfg.group_size, learning_rate=cfg.learning_rate,
                              async_level=level)
            m, final_params = train_runs(task, kl, run, betas, seeds, return_params=True)
            info = describe_objective(RunObjective(kl, group_size=cfg.group_size, async_level=level,
                                                   max_new_tokens=cfg.response_len))
            for i, beta in enumerate(cfg.betas):
                gap, nonfinite = m["gap"][:, i], m["nonfinite"][:, i]
                fp_gap = float(exact_metrics(fp_logps[i], ref_logp, task.rewards_pn, beta)["gap"])  # NaN: none
                dists = [_beta_kl(task_logps(task, jax.tree.map(lambda x, i=i, s=s: x[i, s], final_params)),
                                  fp_logps[i], beta) for s in range(cfg.seeds)]
                why = unstable(gap, nonfinite)
                row_name = f"{name} async={level} beta={beta:g}"
                initial, final = float(gap[0].mean()), float(gap[-1].mean())
                rows.append({
                    "name": row_name, "preset": name, "async_level": level, "beta": float(beta),
                    # unbiased for J = E[R] - beta KL_seq at this beta, which the gap measures; a row with
                    # no KL term follows grad E[R], not grad J: not unbiased for it (verdict "no KL").
                    "unbiased": bool(info.unbiased) and kl.placement != "none",
                    "verdict": info.verdict if kl.placement != "none" else "no KL",
                    "initial_gap": initial, "final_gap_mean": final, "final_gap_std": float(gap[-1].std()),
                    "seeds": int(cfg.seeds), "final_kl_seq_mean": float(m["kl_seq"][-1, i].mean()),
                    "final_reward_mean": float(m["reward"][-1, i].mean()),
                    "fixed_point_gap": fp_gap, "fixed_point_boundary": bool(fp.diverges[i]),
                    "distance_to_fixed_point": float(np.mean(dists)),
                    "nonfinite_updates": int(nonfinite.sum()),
                    "max_grad_norm": float(np.nanmax(m["grad_norm"][:, i])),
                    "unstable": bool(why), "unstable_reason": why,
                    "converged_to": classify(initial, final, float(np.mean(dists)), fp_gap, bool(fp.diverges[i]), why),
                })
                curves[row_name] = {k: m[k][:, i] for k in ("gap", "kl_seq", "reward")}
            if progress is not None:
                progress(f"{name} async={level}")
    meta = {**{k: v for k, v in dataclasses.asdict(cfg).items()}, "runtime_s": time.perf_counter() - t0,
            "unstable_rule": UNSTABLE_RULE, "converged_rule": CONVERGED_RULE, "rewards": task.rewards_pn.tolist(),
            "num_responses": int(task.responses_nr.shape[0]), "aggregation": "seq-mean-token-sum-norm",
            "advantage": "rloo", "optimizer": "AdamW (clip 1), cosine schedule"}
    return {"meta": meta, "rows": rows, "curves": curves}
