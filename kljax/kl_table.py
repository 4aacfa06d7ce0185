"""The KL configurations of KL_MATH.md as ready presets, and the `kljax kl-configs` command."""

from __future__ import annotations

import argparse
import dataclasses
import json

from kljax.kl import KLConfig, describe

_S = KLConfig
# (preset, who uses it / why it is in the table)
PRESETS: tuple[tuple[KLConfig, str], ...] = (
    (_S(placement="none"), "no KL regularization (baseline)"),
    (_S("k1", "reward"), "the paper's recommended default"),
    (_S("k1", "reward", credit="reward_to_go"), "k1 in reward with reward-to-go credit: lower variance"),
    (_S("k1", "loss"), "Tunix/MaxText default"),
    (_S("k2", "loss"), "k2 in loss, per token"),
    (_S("k2", "loss", scope="sequence"), "k2 of the summed log-ratio: equals k1-in-reward per sample, no baseline"),
    (_S("k3", "reward"), "the paper saw training collapse"),
    (_S("k3", "loss"), "GRPO, verl low_var_kl, TRL, EasyDeL"),
    (_S("k1", "both"), "any value-unbiased estimator in both places"),
    (_S("k3", "both"), "the paper's fix for k3"),
    (_S("k2", "both"), "k2's value is biased"),
    (_S("full", "both", credit="reward_to_go"), "Rao-Blackwellized full-vocabulary KL; no anchor system offers it"),
    (_S("full", "loss"), "full-vocabulary KL in loss only"),
    (_S("k3+", "loss"), "verl's straight-through k3+"),
    (_S("k3", "loss", off_policy="token_ratio"), "off-policy: DeepSeek-V3.2 eq. 7, RPG, TRL use_bias_correction_kl"),
    (_S("k1", "reward", off_policy="sequence_weight"), "off-policy: exact sequence importance weight"),
    (_S("k1", "reward", off_policy="sequence_weight", truncation=10.0), "off-policy: truncated sequence weight"),
)


def table_rows() -> list[dict]:
    """One dict per preset: name, the settings, gradient, unbiased, unbiased_off_policy, off_policy_note, note."""
    rows = []
    for config, note in PRESETS:
        info = describe(config)
        skip = ("beta", "target_kl", "adapt_horizon")
        settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in skip}
        rows.append(
            {
                "name": info.name,
                **settings,
                "gradient": info.gradient,
                "unbiased": info.unbiased,
                "unbiased_off_policy": info.unbiased_off_policy,
                "off_policy_note": info.off_policy,
                "note": note,
            }
        )
    return rows


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects instead of a table")


def run(args: argparse.Namespace) -> int:
    rows = table_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'name':<{width}}  unbiased  expected gradient (on-policy)")
    for r in rows:
        mark = "yes" if r["unbiased"] else "no"
        print(f"{r['name']:<{width}}  {mark:<8}  {r['gradient']}")
        print(f"{'':<{width}}  {'':<8}  ({r['note']}; off-policy: {r['off_policy_note']})")
    return 0
