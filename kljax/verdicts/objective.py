"""What the gradient the trainer takes is, in expectation, for a run's whole objective.

`kljax.verdicts.kl.describe` states the KL part alone; the whole gradient also depends on the aggregation,
the advantage's baseline and scale, staleness and the sampler. With J = E[R] - beta KL_seq (J = E[R] without a
KL term), every loss term weighted alike (`kljax.rl.objective`) and one update per batch from the current
policy, the expected gradient of the loss is c * grad(-J) exactly when
  - the aggregation is a constant: seq-mean-token-sum (c = 1) or seq-mean-token-sum-norm (c = 1/R, R =
    max_new_tokens); seq-mean-token-mean and token-mean weigh sequences by length: biased when lengths vary;
  - the baseline leaves the score function unbiased: RLOO (c = 1) or Dr. GRPO's group mean (c = (G-1)/G on
    what passes through the advantages); GRPO divides by the group's std, which depends on the sample: biased;
  - the KL part is unbiased for grad KL_seq (`describe`), and its reward- and loss-placed parts and the task
    reward carry the same c (Dr. GRPO's (G-1)/G reaches only the advantages: with a loss-placed part not zero
    in expectation, or a task reward next to a loss-placed KL, the effective beta changes);
  - the samples are fresh and the sampler is the policy (`describe_objective`).
Checked by exact enumeration: tests/test_objective_exact.py, tests/test_verdict_rollout.py (the rollout).
"""

from __future__ import annotations

import dataclasses
import warnings
from fractions import Fraction
from typing import Any

from kljax.rl.advantages import DEFAULT_STD_EPS
from kljax.rl.kl import KLBiasWarning, KLConfig
from kljax.rl.objective import CONSTANT_AGGREGATIONS, DEFAULT_AGGREGATION, check_aggregation
from kljax.verdicts.kl import KLDescription, describe

VERDICTS = ("unbiased", "scaled", "biased")


@dataclasses.dataclass(frozen=True)
class RunObjective:
    """The settings of a run that decide what its gradient is (a subset of `RLConfig` + `KLConfig`).

    task_reward: False when the reward is identically zero (then J = -beta KL_seq); studies only."""

    kl: KLConfig
    aggregation: str = DEFAULT_AGGREGATION
    advantage: str = "rloo"
    group_size: int = 4
    clip_low: float | None = 0.2
    clip_high: float | None = None
    updates_per_batch: int = 1
    async_level: int = 0
    max_new_tokens: int | None = None
    task_reward: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    clip_ratio_c: float | None = None
    std_eps: float = DEFAULT_STD_EPS
    advantage_scale: str = "group"
    repetition_penalty: float = 1.0
    mask_truncated: bool = False

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation)

    @classmethod
    def from_rl(cls, rl: Any, kl: KLConfig, task_reward: bool = True) -> RunObjective:
        """From a `kljax.config.RLConfig` (or anything with its field names)."""
        return cls(kl, rl.loss_aggregation, rl.advantage, rl.group_size, rl.clip_low, rl.clip_high,
                   rl.updates_per_batch, rl.async_level, rl.max_new_tokens, task_reward, rl.temperature, rl.top_p,
                   rl.top_k, float(getattr(rl, "min_p", 0.0)), rl.clip_ratio_c, rl.advantage_std_eps,
                   getattr(rl, "advantage_scale", "group"), float(getattr(rl, "repetition_penalty", 1.0)),
                   bool(getattr(rl, "mask_truncated", False)))

    @property
    def truncation(self) -> str:
        """The sampler's truncations and penalty in words ("" when it draws from the whole tempered policy)."""
        cut = [f"top_p={self.top_p}" if self.top_p < 1 else "", f"top_k={self.top_k}" if self.top_k > 0 else "",
               f"min_p={self.min_p}" if self.min_p > 0 else "",
               f"repetition_penalty={self.repetition_penalty:g}" if self.repetition_penalty != 1 else ""]
        return ", ".join(c for c in cut if c)

    @property
    def policy(self) -> str:
        """The policy trained, in words."""
        if self.temperature in (0.0, 1.0):
            return "pi = softmax(logits)"
        return f"pi = softmax(logits / {self.temperature:g}) (rl.temperature), pi_ref likewise"


@dataclasses.dataclass(frozen=True)
class ObjectiveDescription:
    """verdict: "unbiased" (E[g] = grad(-J)), "scaled" (E[g] = scale * grad(-J), scale > 0
    constant) or "biased"; scale: the constant where known (None when biased, or when it needs
    max_new_tokens and that is not given); scale_text: it in words; gradient: one line for people;
    reasons: why it is biased (empty otherwise); kl: the KL part's own description."""

    name: str
    verdict: str
    scale: float | None
    scale_text: str
    gradient: str
    reasons: tuple[str, ...]
    kl: KLDescription
    warning: str | None
    policy: str = "pi = softmax(logits)"

    @property
    def unbiased(self) -> bool:
        """Unbiased for grad J up to a positive constant (what an optimizer with a tuned step size needs)."""
        return self.verdict != "biased"


def _pathwise_zero(kl: KLConfig) -> bool:
    """The loss-placed part has zero expected gradient on-policy (k1: E[grad log pi] = 0)."""
    return kl.estimator == "k1" and kl.off_policy != "token_ratio"


def _fraction_text(f: Fraction) -> str:
    return "1" if f == 1 else f"{f.numerator}/{f.denominator}"


def describe_objective(run: RunObjective) -> ObjectiveDescription:
    """The expected gradient of the run's whole loss against grad(-J) (the module doc's conditions).

    Stale samples (rl.async_level > 0, or every update after the first with rl.updates_per_batch > 1) reach the
    task reward through clipped per-token importance ratios, which do not correct the prefix distribution:
    biased; only a KL part with an exact sequence weight stays unbiased there. The sampler is part of the
    objective: the policy trained is the tempered one, as in TRL and verl, pi = softmax(logits / T) at
    T = rl.temperature and pi_ref = softmax(ref_logits / T), so J is J_T = E_{pi_T}[R] - beta KL(pi_T || pi_ref,T)
    and a sampler at any T > 0 is on-policy (its log-probs are pi_T's). A sampler that truncates (top-k, top-p,
    min-p) or penalizes repeats is not the policy: it never draws the tokens it cuts (or draws repeats less
    often), which no importance ratio corrects: biased. Leaving truncated responses out of the loss
    (rl.mask_truncated) is biased. Greedy decoding (T = 0) samples nothing: biased.
    """
    kl, info = run.kl, describe(run.kl)
    reasons: list[str] = []
    stale = run.async_level > 0 or run.updates_per_batch > 1
    no_kl = kl.placement == "none"
    # The reward-placed KL reaches the gradient through the advantages, scaled by their baseline's
    # coefficient unless it is added after the baseline (kl.in_baseline False).
    kl_via_advantages = kl.in_reward and kl.off_policy != "sequence_weight" and kl.in_baseline
    through_advantages = run.task_reward or kl_via_advantages
    if run.temperature == 0:
        reasons.append("greedy decoding (rl.temperature=0) draws the most likely response, not a sample of the "
                       "policy: no score-function gradient is an expectation under it")
    elif run.truncation:
        reasons.append(f"the sampler is not the policy ({run.truncation}): it never draws the tokens it cuts or "
                       "draws repeats less often, and the per-token ratios pi/mu of the tokens it draws do not "
                       "correct for that")
    if run.mask_truncated:
        reasons.append("rl.mask_truncated leaves the responses cut at max_new_tokens out of the loss: the gradient "
                       "is taken over the responses that stopped only")

    # The aggregation's constant, or its length weighting.
    agg_scale: Fraction | None = Fraction(1)
    agg_text = ""
    if run.aggregation == "seq-mean-token-sum-norm":
        agg_text = "1/max_new_tokens" if run.max_new_tokens is None else f"1/{run.max_new_tokens}"
        agg_scale = None if run.max_new_tokens is None else Fraction(1, run.max_new_tokens)
    elif run.aggregation not in CONSTANT_AGGREGATIONS:
        what = "its own length" if run.aggregation == "seq-mean-token-mean" else "the batch's token count"
        reasons.append(f"length weighting: loss_aggregation={run.aggregation!r} divides each sequence's terms by "
                       f"{what}, so E[gradient] is not grad J when response lengths vary")

    # The advantage's coefficient on what passes through it.
    c_adv = Fraction(1)
    if run.advantage == "dr_grpo":
        c_adv = Fraction(run.group_size - 1, run.group_size)
    elif run.advantage == "grpo" and through_advantages:
        whose = "group's" if run.advantage_scale == "group" else "batch's"
        reasons.append(f"advantage='grpo' divides by the {whose} reward std, which depends on the sample itself")

    c = c_adv if run.task_reward else Fraction(1)  # the scale J's gradient must carry
    if stale:
        when = f"rl.async_level={run.async_level}" if run.async_level else (
            f"rl.updates_per_batch={run.updates_per_batch} (every update after the first)")
        if run.task_reward:
            clip = "" if run.clip_low is None else ", clipped"
            clip += "" if run.clip_ratio_c is None else f" and dual-clipped at {run.clip_ratio_c:g}"
            reasons.append(f"stale samples ({when}): the task reward's per-token importance ratios{clip} do not "
                           "correct the sampler's prefix distribution")
        if not no_kl and not info.unbiased_off_policy:
            reasons.append(f"stale samples ({when}), KL part: {info.off_policy}")
        if not run.task_reward and not no_kl:
            c = c_adv if kl_via_advantages else Fraction(1)
    elif not no_kl:
        c_reward = c_adv if kl_via_advantages else Fraction(1)
        if not info.unbiased:
            reasons.append(f"KL part {info.name!r}: {info.gradient}")
            s_kl = None
        elif kl.placement == "reward" or (kl.placement == "both" and _pathwise_zero(kl)):
            s_kl = c_reward
        elif kl.placement == "loss" or c_reward == 1:
            s_kl = Fraction(1)
        else:
            s_kl = None
            reasons.append(f"advantage='dr_grpo' scales the reward-placed KL by {_fraction_text(c_reward)} and not "
                           "the loss-placed KL, whose expected gradient is not zero")
        if s_kl is not None:
            if run.task_reward and s_kl != c_adv:
                beta_factor = s_kl / c_adv
                reasons.append(f"advantage={run.advantage!r} scales the task reward by {_fraction_text(c_adv)} and "
                               f"the KL by {_fraction_text(s_kl)}: the effective beta is "
                               f"{_fraction_text(beta_factor)} x kl.beta")
            c = s_kl if not run.task_reward else c_adv
    elif not run.task_reward:
        reasons.append("no task reward and no KL term: the loss has no gradient")

    name = f"{info.name} / {run.aggregation} / {run.advantage}" + (f" / async {run.async_level}" if run.async_level
                                                                     else "")
    target = "grad E[R]" if no_kl else "grad J" if run.task_reward else "grad(-beta KL_seq)"
    if reasons:
        verdict, scale, scale_text = "biased", None, ""
        gradient = f"not {target}: " + "; ".join(reasons)
    else:
        parts = [t for t in (_fraction_text(c) if c != 1 else "", agg_text) if t]
        scale_text = " x ".join(parts) if parts else "1"
        scale = None if agg_scale is None else float(c * agg_scale)
        verdict = "unbiased" if scale_text == "1" else "scaled"
        gradient = target if verdict == "unbiased" else f"{scale_text} x {target}"
    warning = None
    if run.temperature not in (0.0, 1.0):
        gradient += f" (for the tempered policy: {run.policy})"
        name += f" / T {run.temperature:g}"
    if run.truncation:
        name += f" / {run.truncation}"
    if run.mask_truncated:
        name += " / mask truncated"
    if verdict == "biased":
        warning = (f"the objective {name!r} is biased: its expected gradient is {gradient}. It is allowed (studies "
                   "need it); `kljax kl-configs` lists the unbiased settings.")
    return ObjectiveDescription(name, verdict, scale, scale_text, gradient, tuple(reasons), info, warning,
                                run.policy)


def warn_if_biased(run: RunObjective | KLConfig) -> ObjectiveDescription | KLDescription:
    """Warn (KLBiasWarning) when a run's objective (or a KL configuration alone) is biased; returns the description."""
    info: ObjectiveDescription | KLDescription
    info = describe(run) if isinstance(run, KLConfig) else describe_objective(run)
    if info.warning:
        warnings.warn(info.warning, KLBiasWarning, stacklevel=2)
    return info
