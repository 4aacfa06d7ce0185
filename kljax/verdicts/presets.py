"""The KL configurations as ready presets, and `table_rows`: each preset's expected gradient under a
run's aggregation, advantage and sampler staleness (`kljax.verdicts.objective`). `kljax kl-configs` prints it."""

from __future__ import annotations

import dataclasses

from kljax.rl.kl import KLConfig
from kljax.verdicts.audit import with_users
from kljax.verdicts.objective import RunObjective, describe_objective

_S = KLConfig
# (preset, what it is); `kljax.verdicts.audit.with_users` appends the peer trainers' settings that give it,
# translated from the peer defaults table (kljax.verdicts.peers.PEERS), so the labels cannot drift from it.
_NOTES: tuple[tuple[KLConfig, str], ...] = (
    (_S(placement="none"), "no KL regularization (baseline)"),
    (_S("k1", "reward"), "the paper's recommended default"),
    (_S("k1", "reward", credit="reward_to_go"), "k1 in reward with reward-to-go credit: lower variance"),
    (_S("k1", "loss"), "k1 in loss: zero expected gradient"),
    (_S("k2", "loss"), "k2 in loss, per token"),
    (_S("k2", "loss", scope="sequence"), "k2 of the summed log-ratio: equals k1-in-reward per sample, no baseline"),
    (_S("k3", "reward"), "the paper saw training collapse"),
    (_S("k3", "loss"), "k3 (low_var_kl) in loss, as in the GRPO paper"),
    (_S("k1", "both"), "any value-unbiased estimator in both places"),
    (_S("k3", "both"), "the paper's fix for k3"),
    (_S("k2", "both"), "k2's value is biased"),
    (_S("full", "both", credit="reward_to_go"), "Rao-Blackwellized full-vocabulary KL; no peer trainer offers it"),
    (_S("full", "loss"), "full-vocabulary KL in loss only"),
    (_S("k3+", "loss"), "straight-through k3+ (k3 value, k2 gradient)"),
    (_S("k3", "loss", off_policy="token_ratio"), "off-policy: DeepSeek-V3.2 eq. 7, RPG"),
    (_S("k1", "reward", off_policy="sequence_weight"), "off-policy: exact sequence importance weight"),
    (_S("k1", "reward", off_policy="sequence_weight", truncation=10.0), "off-policy: truncated sequence weight"),
)
# (preset, who uses it / why it is in the table)
PRESETS: tuple[tuple[KLConfig, str], ...] = tuple(
    (config, with_users(config, note, tuple(c for c, _ in _NOTES))) for config, note in _NOTES
)


def table_rows(run: RunObjective | None = None) -> list[dict]:
    """One dict per preset under the run's other settings (`run`, default: the default run's):
    name, the KL settings, aggregation, advantage, unbiased (for grad J up to a constant), verdict,
    scale, gradient (of the whole objective), reasons (why it is biased), kl_gradient and kl_unbiased
    (the KL part alone), unbiased_off_policy, off_policy_note, note."""
    run = run or RunObjective(KLConfig())
    rows = []
    for config, note in PRESETS:
        info = describe_objective(dataclasses.replace(run, kl=config))
        skip = ("beta", "target_kl", "adapt_horizon")
        settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in skip}
        rows.append(
            {
                "name": info.kl.name,
                **settings,
                "aggregation": run.aggregation,
                "advantage": run.advantage,
                # no KL term follows grad E[R], not grad J of the table's header: not unbiased for it
                "unbiased": bool(info.unbiased) and config.placement != "none",
                "verdict": info.verdict,
                "scale": info.scale,
                "gradient": info.gradient,
                "reasons": list(info.reasons),
                "kl_gradient": info.kl.gradient,
                "kl_unbiased": info.kl.unbiased,
                "unbiased_off_policy": info.kl.unbiased_off_policy,
                "off_policy_note": info.kl.off_policy,
                "note": note,
            }
        )
    return rows
