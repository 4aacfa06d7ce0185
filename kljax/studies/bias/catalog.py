"""Named sets of KL configurations for studies, and configuration names -> `KLConfig`.

Names are `kljax.verdicts.kl.config_name`'s: estimator-placement[-rtg][-seq][-tokratio|-seqw[C]], e.g.
'k1-reward', 'k1-reward-rtg', 'k2-loss-seq', 'k3-loss-tokratio', 'k1-reward-seqw10', or 'none'.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from kljax.rl import estimators as est
from kljax.rl.kl import CREDITS, OFF_POLICY, PLACEMENTS, SCOPES, KLConfig
from kljax.verdicts.kl import config_name
from kljax.verdicts.presets import PRESETS

NAMED_SETS = ("presets", "grid", "paper")


def preset_configs() -> tuple[KLConfig, ...]:
    """The rows of `kljax.verdicts.presets.PRESETS`."""
    return tuple(c for c, _ in PRESETS)


def paper_configs() -> tuple[KLConfig, ...]:
    """The paper's configurations (arXiv 2512.21852): k1/k3 in reward or in loss, and the 'both' fix."""
    return tuple(config_from_name(n) for n in ("k1-reward", "k3-reward", "k1-loss", "k3-loss", "k1-both", "k3-both"))


def grid_configs(truncations: Iterable[float] = (10.0,)) -> tuple[KLConfig, ...]:
    """Every valid (estimator, placement, credit, scope, off_policy) combination, plus the
    sequence-weighted ones truncated at each value in `truncations`. Placement 'none' is left out."""
    out = []
    grid = itertools.product(est.ESTIMATOR_NAMES, PLACEMENTS[1:], CREDITS, SCOPES, OFF_POLICY)
    for estimator, placement, credit, scope, off in grid:
        try:
            config = KLConfig(estimator, placement, credit, scope, off)
        except ValueError:
            continue
        out.append(config)
        if off == "sequence_weight":
            out.extend(config.replace(truncation=float(c)) for c in truncations)
    return tuple(out)


def offpolicy_configs(truncations: Iterable[float]) -> tuple[KLConfig, ...]:
    """For the off-policy trade-off: no correction, token ratios, and sequence weights, plain and
    truncated at each value, for k1 in reward, k3 in loss / both and the Rao-Blackwellized config."""
    names = [
        "k1-reward",
        "k1-reward-seqw",
        "k3-loss",
        "k3-loss-tokratio",
        "k3-both",
        "k3-both-tokratio",
        "k1-both-tokratio",
        "full-both-rtg",
        "full-both-rtg-tokratio",
        "full-both-rtg-seqw",
    ]
    out = [config_from_name(n) for n in names]
    out.extend(KLConfig("k1", "reward", off_policy="sequence_weight", truncation=float(c)) for c in truncations)
    return tuple(out)


def rao_blackwell_configs() -> tuple[KLConfig, ...]:
    """k1 in reward (sequence credit, reward-to-go) and the Rao-Blackwellized full-vocabulary config."""
    return tuple(config_from_name(n) for n in ("k1-reward", "k1-reward-rtg", "full-both-rtg"))


def _name_error(name: str, why: str) -> ValueError:
    examples = ", ".join(config_name(c) for c in preset_configs())
    return ValueError(
        f"unknown KL configuration name {name!r} ({why}). Names are estimator-placement[-rtg][-seq]"
        f"[-tokratio|-seqw[C]] with estimator in {list(est.ESTIMATOR_NAMES)}, placement in "
        f"{list(PLACEMENTS[1:])}, or 'none'; or a set: {list(NAMED_SETS)}. Valid names include: {examples}"
    )


def config_from_name(name: str) -> KLConfig:
    """The `KLConfig` whose `config_name` is `name`; ValueError listing valid names otherwise."""
    name = name.strip()
    if name == "none":
        return KLConfig(placement="none")
    parts = name.split("-")
    if len(parts) < 2:
        raise _name_error(name, "expected at least estimator-placement")
    fields: dict = {"estimator": parts[0], "placement": parts[1]}
    for flag in parts[2:]:
        if flag == "rtg":
            fields["credit"] = "reward_to_go"
        elif flag == "seq":
            fields["scope"] = "sequence"
        elif flag == "tokratio":
            fields["off_policy"] = "token_ratio"
        elif flag.startswith("seqw"):
            fields["off_policy"] = "sequence_weight"
            if flag != "seqw":
                try:
                    fields["truncation"] = float(flag[4:])
                except ValueError:
                    raise _name_error(name, f"bad truncation {flag[4:]!r}") from None
        else:
            raise _name_error(name, f"unknown part {flag!r}")
    try:
        config = KLConfig(**fields)
    except ValueError as err:
        raise _name_error(name, str(err)) from None
    if config_name(config) != name:
        raise _name_error(name, f"its canonical name is {config_name(config)!r}")
    return config


def resolve(spec: str | Iterable[str], truncations: Iterable[float] = (10.0,)) -> tuple[KLConfig, ...]:
    """'presets', 'grid', 'paper', or configuration names (a comma-separated string or a list)."""
    if isinstance(spec, str):
        if spec in ("presets", "grid", "paper"):
            return {"presets": preset_configs, "paper": paper_configs}.get(spec, lambda: grid_configs(truncations))()
        spec = [s for s in spec.split(",") if s.strip()]
    names = list(spec)
    if not names:
        raise _name_error("", "empty list")
    return dedupe(config_from_name(n) for n in names)


def dedupe(configs: Iterable[KLConfig]) -> tuple[KLConfig, ...]:
    """Keep the first configuration of each name, in order."""
    seen: dict[str, KLConfig] = {}
    for c in configs:
        seen.setdefault(config_name(c), c)
    return tuple(seen.values())
