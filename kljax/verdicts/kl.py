"""What each KL configuration's gradient is, in expectation: the table of docs/kl_math.md as rules.

The decomposition behind every row (on-policy, y ~ pi_theta):
    grad E[sum_t k_t] = E[sum_t grad k_t]  (pathwise: the "loss" part)
                      + E[(sum_t k_t) grad log pi(y|x)]  (score function: the "reward" part).
So "both" is unbiased for grad KL_seq exactly when the estimator's value is unbiased for KL_seq and
its pathwise gradient is the gradient of that value (not straight-through); "reward" alone is
unbiased only when the pathwise part is zero in expectation (k1); "loss" alone only when the pathwise
part is itself grad KL_seq (k2 or k3+ applied to the sequence sum). Every claim here is checked by
exact enumeration in tests/test_kl_exact.py, on-policy and with a different sampler.
"""

from __future__ import annotations

import dataclasses

from kljax.rl.kl import KLConfig

REVERSE_SEQ = "unbiased grad of the sequence-level reverse KL"
ZERO = "zero in expectation: no regularization, only noise"
PARTIAL_REVERSE = (
    "partial reverse KL: per-token KL(pi || pi_ref) with prefixes held fixed (misses the effect on future tokens)"
)
PARTIAL_FORWARD = "partial forward KL: per-token KL(pi_ref || pi) with prefixes held fixed"
FORWARD_SEQ = "grad of the sequence-level forward KL(pi_ref || pi), not the reverse KL"
NONE = "no KL term"

# Pathwise ("in loss") gradient in expectation, by (scope, estimator), on-policy.
_PATHWISE = {
    ("token", "k1"): ZERO,
    ("token", "k2"): PARTIAL_REVERSE,
    ("token", "k3"): PARTIAL_FORWARD,
    ("token", "k3+"): PARTIAL_REVERSE,
    ("token", "full"): PARTIAL_REVERSE,
    ("sequence", "k1"): ZERO,
    ("sequence", "k2"): REVERSE_SEQ,
    ("sequence", "k3"): FORWARD_SEQ,
    ("sequence", "k3+"): REVERSE_SEQ,
}
# Score-function ("in reward") gradient in expectation, by (scope, estimator), on-policy.
_SCORE = {
    ("token", "k1"): REVERSE_SEQ,
    ("token", "k2"): "score-function gradient of E[sum_t d_t^2/2], a biased value: not a KL gradient",
    ("token", "k3"): "neither reverse nor forward KL: grad KL_seq minus the partial forward KL gradient",
    ("token", "k3+"): "neither reverse nor forward KL: grad KL_seq minus the partial forward KL gradient",
    ("token", "full"): "grad KL_seq minus the partial reverse KL: misses the pathwise part",
    ("sequence", "k1"): REVERSE_SEQ,
    ("sequence", "k2"): "score-function gradient of E[D^2/2], a biased value: not a KL gradient",
    ("sequence", "k3"): "grad KL_seq minus grad of the sequence-level forward KL: neither",
    ("sequence", "k3+"): "grad KL_seq minus grad of the sequence-level forward KL: neither",
}
_VALUE_UNBIASED = {"k1": True, "k2": False, "k3": True, "k3+": True, "full": True}
_STRAIGHT_THROUGH = {"k3+"}


@dataclasses.dataclass(frozen=True)
class KLDescription:
    """name: short config name; gradient: its expected gradient in words (on-policy);
    unbiased: equals grad KL_seq on-policy; unbiased_off_policy: equals grad KL_seq when the samples
    come from a different (stale) sampler; off_policy: what happens under such a sampler;
    warning: set when the configuration is biased or regularizes nothing."""

    name: str
    gradient: str
    unbiased: bool
    unbiased_off_policy: bool
    off_policy: str
    warning: str | None


def config_name(c: KLConfig) -> str:
    """Short stable name, e.g. 'k1-reward', 'k1-reward-rtg', 'k2-loss-seq', 'k3-loss-tokratio'."""
    if c.placement == "none":
        return "none"
    parts = [c.estimator, c.placement]
    if c.credit == "reward_to_go":
        parts.append("rtg")
    if c.scope == "sequence":
        parts.append("seq")
    if c.off_policy == "token_ratio":
        parts.append("tokratio")
    elif c.off_policy == "sequence_weight":
        parts.append("seqw" if c.truncation is None else f"seqw{c.truncation:g}")
    return "-".join(parts)


def _token_ratio_changes_loss(c: KLConfig) -> bool:
    """On-policy, w_t = 1 but grad w_t = grad log pi_t adds E[k_t grad log pi_t | h_t], which is zero
    only for 'full' (KL_t(h_t) does not depend on y_t)."""
    return c.off_policy == "token_ratio" and c.estimator != "full"


def _loss_gradient(c: KLConfig) -> str:
    if not _token_ratio_changes_loss(c):
        return _PATHWISE[(c.scope, c.estimator)]
    # On-policy grad(w_t k_t) = k_t grad log pi_t + grad k_t: the prefix-fixed gradient of E[k_t | h_t].
    if c.estimator in _STRAIGHT_THROUGH:
        return "2 x partial reverse KL minus partial forward KL (straight-through value and gradient disagree)"
    if _VALUE_UNBIASED[c.estimator]:
        return PARTIAL_REVERSE
    return "prefix-fixed gradient of E[d^2/2], a biased value: not a KL gradient"


def _on_policy(c: KLConfig) -> tuple[str, bool]:
    """(expected gradient in words, unbiased for grad KL_seq) on-policy."""
    if c.placement == "none":
        return NONE, False
    key = (c.scope, c.estimator)
    if c.placement == "reward":
        text = _SCORE[key]
        return text, text == REVERSE_SEQ
    if c.placement == "loss":
        text = _loss_gradient(c)
        return text, text == REVERSE_SEQ
    # both
    exact = (
        _VALUE_UNBIASED[c.estimator] and c.estimator not in _STRAIGHT_THROUGH and not _token_ratio_changes_loss(c)
    )
    if exact:
        text = REVERSE_SEQ
        if c.estimator == "full" and c.credit == "reward_to_go":
            text += ", Rao-Blackwellized: the lowest-variance configuration"
        return text, True
    if not _VALUE_UNBIASED[c.estimator]:
        return f"grad of E[sum_t {c.estimator}_t]: the estimator's value is biased, so not grad KL_seq", False
    return f"biased sum of two parts: reward part ({_SCORE[key]}) + loss part ({_loss_gradient(c)})", False


def _off_policy(c: KLConfig, unbiased: bool) -> tuple[str, bool]:
    """(what happens when y ~ mu != pi_theta, unbiased off-policy)."""
    if c.placement == "none":
        return NONE, False
    if c.off_policy == "sequence_weight":
        if c.truncation is None:
            if unbiased:
                return "exact sequence importance weight: unbiased for grad KL_seq, high variance", True
            return "sequence importance weight reproduces the on-policy expectation, which is biased", False
        return f"sequence importance weight truncated at {c.truncation:g}: biased, lower variance", False
    if c.off_policy == "token_ratio":
        if _VALUE_UNBIASED[c.estimator] and c.estimator not in _STRAIGHT_THROUGH and c.placement == "loss":
            return "partial reverse KL at the prefixes the sampler visits (DeepSeek-V3.2 eq. 7 for k3)", False
        return "token ratios do not correct the prefix distribution: biased", False
    return "not corrected for the sampler: biased for grad KL_seq", False


def describe(c: KLConfig) -> KLDescription:
    """What this configuration's KL gradient is in expectation, whether it is unbiased for
    grad KL_seq on-policy and off-policy, and the warning a run configured with it prints."""
    gradient, unbiased = _on_policy(c)
    off_text, off_unbiased = _off_policy(c, unbiased)
    name = config_name(c)
    warning = None
    if c.placement != "none" and not unbiased:
        kind = "regularizes nothing" if gradient == ZERO else "is biased"
        warning = (
            f"KL configuration {name!r} {kind}: its expected gradient is {gradient}, not the gradient of the "
            "sequence-level reverse KL the objective states. It is allowed (studies need it); "
            "run `kljax kl-configs` for the unbiased ones."
        )
    return KLDescription(name, gradient, unbiased, off_unbiased, off_text, warning)
