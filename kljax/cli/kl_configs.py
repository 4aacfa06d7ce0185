"""`kljax kl-configs`: every KL preset and the expected gradient of the whole objective under the
run settings given (aggregation, advantage, group size, sampler staleness, the sampler's temperature
and truncation: the policy trained is softmax(logits / temperature), `kljax.verdicts.objective`)."""

from __future__ import annotations

import argparse
import json

from kljax.config.rl import RLConfig
from kljax.rl.advantages import METHODS, MIN_GROUP
from kljax.rl.kl import KLConfig
from kljax.rl.objective import AGGREGATIONS, DEFAULT_AGGREGATION
from kljax.verdicts.objective import RunObjective
from kljax.verdicts.presets import table_rows


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects instead of a table")
    parser.add_argument("--aggregation", default=DEFAULT_AGGREGATION, choices=AGGREGATIONS,
                        help="rl.loss_aggregation the verdicts are for (default: %(default)s, the default run's)")
    parser.add_argument("--advantage", default="rloo", choices=METHODS, help="rl.advantage (default: %(default)s)")
    parser.add_argument("--group-size", type=int, default=RLConfig.group_size,
                        help="rl.group_size (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=RLConfig.max_new_tokens,
                        help="rl.max_new_tokens, the seq-mean-token-sum-norm normalizer (default: %(default)s)")
    parser.add_argument("--async-level", type=int, default=0, help="rl.async_level: stale samplers (default: 0)")
    parser.add_argument("--temperature", type=float, default=RLConfig.temperature,
                        help="rl.temperature: the policy trained is softmax(logits / T) (default: %(default)s, "
                             "the default run's)")
    parser.add_argument("--top-p", type=float, default=RLConfig.top_p, help="rl.top_p (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=RLConfig.top_k, help="rl.top_k (default: %(default)s, off)")


def run(args: argparse.Namespace) -> int:
    if args.group_size < MIN_GROUP[args.advantage]:
        raise ValueError(f"--group-size={args.group_size}: advantage {args.advantage!r} needs >= "
                         f"{MIN_GROUP[args.advantage]}")
    for name in ("max_new_tokens", "async_level"):
        if getattr(args, name) < (1 if name == "max_new_tokens" else 0):
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range")
    for flag, value, ok, valid in (("--temperature", args.temperature, args.temperature >= 0, ">= 0 (0 = greedy)"),
                                   ("--top-p", args.top_p, 0 < args.top_p <= 1, "in (0, 1]"),
                                   ("--top-k", args.top_k, args.top_k >= 0, ">= 0 (0 = off)")):
        if not ok:
            raise ValueError(f"{flag}={value} must be {valid}")
    objective = RunObjective(KLConfig(), args.aggregation, args.advantage, args.group_size,
                             async_level=args.async_level, max_new_tokens=args.max_new_tokens,
                             temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    rows = table_rows(objective)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"objective: loss_aggregation={args.aggregation}, advantage={args.advantage}, group_size={args.group_size}, "
          f"max_new_tokens={args.max_new_tokens}, async_level={args.async_level}, temperature={args.temperature}, "
          f"top_p={args.top_p}, top_k={args.top_k}")
    print(f"J = E[R] - beta KL_seq of the policy trained, {objective.policy}; 'gradient' is E[-grad loss], the "
          "direction the trainer moves in on average")
    print(f"{'name':<{width}}  verdict   expected gradient of the whole objective")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['verdict']:<8}  {_gradient(r)}")
        print(f"{'':<{width}}  {'':<8}  KL part: {r['kl_gradient']}")
        print(f"{'':<{width}}  {'':<8}  ({_notes(r)})")
    return 0


def _gradient(row: dict) -> str:
    """The row's gradient, a biased one's KL-part reason left to the "KL part:" line below it."""
    if row["verdict"] != "biased":
        return row["gradient"]
    target = row["gradient"].split(":", 1)[0]  # "not grad J"
    other = [r for r in row["reasons"] if not r.startswith(f"KL part {row['name']!r}")]
    return f"{target}: " + "; ".join(other + (["its KL part, below"] if len(other) < len(row["reasons"]) else []))


def _notes(row: dict) -> str:
    """The preset's note and its off-policy behaviour, each said once."""
    note = row["note"].removeprefix("off-policy: ")
    off = row["off_policy_note"]
    return f"off-policy: {off}" if off.startswith(note) else f"{note}; off-policy: {off}"
