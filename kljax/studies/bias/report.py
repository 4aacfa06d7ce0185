"""Reports of a gradient-bias study: the printed table, JSON and CSV files, and docs/bias_table.md."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# The paper's classification (arXiv 2512.21852), by configuration name.
PAPER = {
    "k1-reward": "unbiased; recommended (stable, best in and out of domain)",
    "k3-reward": "biased; training collapsed",
    "k1-loss": "biased: no regularization in expectation; unstable",
    "k3-loss": "biased; stable but worse",
    "k1-both": "'both' fixes the bias",
    "k3-both": "'both' fixes the bias",
}


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become None, numpy scalars plain Python."""
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json(obj: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(obj), indent=2) + "\n")
    return path


def write_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Rows with possibly different keys -> one CSV (union of keys, first-seen order)."""
    rows = list(rows)
    fields: dict[str, None] = {}
    for r in rows:
        fields.update(dict.fromkeys(r))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _clean(v) for k, v in r.items()})
    return path


def json_entries(result: Mapping[str, Any]) -> list[dict]:
    """The `--json` list: one entry per configuration (name, unbiased, relative_bias, variance,
    cosine, mse, gradient, claimed_unbiased, and the off-policy and Monte-Carlo columns)."""
    return [_clean(dict(row)) for row in result["table"]]


def write_outputs(result: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """study.json (everything), table.csv, figures.csv (every record), offpolicy.csv."""
    out = Path(out_dir)
    return [
        write_json(result, out / "study.json"),
        write_csv(result["table"], out / "table.csv"),
        write_csv(result["records"], out / "figures.csv"),
        write_csv(result["offpolicy"], out / "offpolicy.csv"),
    ]


def _yn(flag: bool) -> str:
    return "unbiased" if flag else "biased"


def _sci(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1e}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e3)) else f"{x:.3f}"


def _mismatch_reason(row: Mapping[str, Any]) -> str:
    if "seqw" in row["name"] and row.get("off_policy_truncated_fraction", 1.0) == 0.0:
        return "the truncation never clips at this staleness (P(W > C) = 0), so it is exact here"
    return "claim and measurement disagree"


def format_table(result: Mapping[str, Any]) -> str:
    """The human-readable summary printed at the end of `kljax bias-study`."""
    s, rows = result["settings"], result["table"]
    stale = s["staleness"]
    stale_kl = s["sampler_kl_by_staleness"][str(stale)]
    by = rows[0]["measured_by"] if rows else "exact"
    lines = [
        f"KL-gradient bias study: {s['policy']} policy, vocab {s['vocab']}, length {s['length']} "
        f"({s['n_sequences']:,} sequences, {s['n_params']:,} parameters), seed {s['seed']}, float64",
        f"theta after {s['train_steps']} {s['optimizer']} steps of reward - {s['beta']:g} * KL: "
        f"KL_seq(pi || pi_ref) = {s['kl_theta_ref']:.3f}, reward {s['reward']:.3f}.  "
        f"Batch B = {s['samples']} sequences; "
        f"stale sampler = theta from {stale} steps earlier (KL(pi || mu) = {stale_kl:.3f}).",
        f"Measured by {'exact enumeration' if by == 'exact' else 'Monte Carlo'}"
        + (
            f"; MC column: {s['repeats']} batches (bias +- standard error)"
            if "mc_relative_bias" in (rows or [{}])[0]
            else ""
        )
        + ". Variance = trace of the covariance of the B-sample gradient estimate.",
        "",
    ]
    has_mc = bool(rows) and "mc_relative_bias" in rows[0]
    head = f"{'configuration':<19} {'describe':<9} {'measured':<9} {'rel.bias':>8} {'variance':>8}"
    head += f" {'var/k1':>6} {'cosine':>6}"
    head += f" {'MC bias':>13}" if has_mc else ""
    head += f" | stale {stale}: {'measured':<9} {'rel.bias':>8} {'cosine':>6}"
    lines += [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['name']:<19} {_yn(r['claimed_unbiased']):<9} {_yn(r['unbiased']):<9} {_sci(r['relative_bias']):>8} "
            f"{_sci(r['variance']):>8} {r['variance_vs_k1_reward']:>6.2f} {r['cosine']:>6.3f}"
        )
        if has_mc:
            line += f" {r['mc_relative_bias']:>6.3f}+-{r['mc_bias_stderr']:<5.3f}"
        line += (
            f" | {'':>8}{_yn(r['off_policy_unbiased']):<9} {_sci(r['off_policy_relative_bias']):>8} "
            f"{r['off_policy_cosine']:>6.3f}"
        )
        lines.append(line)
    lines.append("")
    lines += _findings(result)
    return "\n".join(lines)


def _findings(result: Mapping[str, Any]) -> list[str]:
    rows, s = result["table"], result["settings"]
    out = []
    unbiased = [r["name"] for r in rows if r["unbiased"]]
    out.append(f"Unbiased on-policy (measured): {', '.join(unbiased) or 'none'}.")
    zero = [r["name"] for r in rows if r["verdict"] == "no KL gradient"]
    if zero:
        out.append(f"No KL gradient in expectation (regularize nothing): {', '.join(zero)}.")
    biased = [r for r in rows if r["verdict"] == "biased"]
    if biased:
        out.append("Biased, and what they follow instead of grad KL_seq (who uses them):")
        for r in biased:
            used = f" [{r['note']}]" if r.get("note") else ""
            numbers = f"relative bias {r['relative_bias']:.3f}, cosine {r['cosine']:.3f}"
            out.append(f"  {r['name']}{used}: {numbers}; {r['gradient']}")
    if rows and rows[0]["measured_by"] == "montecarlo":
        unresolved = [r["name"] for r in rows if r["unbiased"] != r["claimed_unbiased"]]
        if unresolved:
            out.append(
                f"Monte Carlo cannot tell these from their claim at {s['repeats']} batches (bias within 3 standard "
                f"errors, or the reverse): {', '.join(unresolved)}. Run with --exact for the exact classification."
            )
    else:
        for r in rows:
            if r["unbiased"] != r["claimed_unbiased"]:
                out.append(
                    f"MISMATCH {r['name']} on-policy: describe says {_yn(r['claimed_unbiased'])}, measured "
                    f"{_yn(r['unbiased'])}."
                )
            if r["off_policy_unbiased"] != r["claimed_unbiased_off_policy"]:
                out.append(
                    f"Note {r['name']} off-policy: describe says {_yn(r['claimed_unbiased_off_policy'])}, "
                    f"measured {_yn(r['off_policy_unbiased'])}: {_mismatch_reason(r)}."
                )
    rb = {
        x["config"]: x
        for x in result["records"]
        if x["figure"] == "rao_blackwell" and x["mode"] == "exact" and x["length"] == s["length"]
    }
    if rb:
        out.append(
            f"Rao-Blackwellization (length {s['length']}): variance of full-both-rtg is "
            f"{rb['full-both-rtg']['variance_reduction']:.1f}x lower than k1-reward's "
            f"(k1-reward-rtg: {rb['k1-reward-rtg']['variance_reduction']:.2f}x), same expected gradient."
        )
    off = {r["name"]: r for r in result["offpolicy"]}
    if off:
        k1, w = off["k1-reward"], off["k1-reward-seqw"]
        text = (
            f"Off-policy ({s['staleness']} steps stale, B = {s['samples']}): uncorrected k1-reward has relative "
            f"bias {k1['relative_bias']:.3f}; the sequence weight removes it at {w['variance'] / k1['variance']:.2f}x "
            "the variance"
        )
        trunc = [r for n, r in off.items() if "seqw" in n and n.startswith("k1-reward-seqw") and n != "k1-reward-seqw"]
        if trunc:
            parts = [
                f"C={r['name'][len('k1-reward-seqw') :]}: bias {r['relative_bias']:.3f}, var "
                f"{r['variance'] / k1['variance']:.2f}x"
                for r in trunc
            ]
            text += "; truncated min(W, C): " + ", ".join(parts)
        out.append(text + ".")
    if "total_s" in result.get("timing", {}):
        out.append(f"Wall time {result['timing']['total_s']:.1f} s.")
    return out


def markdown_table(result: Mapping[str, Any]) -> str:
    """docs/bias_table.md: the measured table next to describe()'s claim and the paper's words."""
    s = result["settings"]
    stale = s["staleness"]
    lines = [
        "# KL-gradient bias of each configuration, measured",
        "",
        "Generated by `kljax.studies.bias.report.markdown_table` from `kljax bias-study` "
        f"(`{s.get('config_file', 'configs/bias_default.py')}`): a {s['policy']} autoregressive policy, vocabulary "
        f"{s['vocab']}, responses of {s['length']} tokens ({s['n_sequences']:,} sequences, enumerated exactly in "
        f"float64), seed {s['seed']}. theta is the toy policy after {s['train_steps']} {s['optimizer']} steps "
        f"on reward - {s['beta']:g} * KL (KL_seq(pi || pi_ref) = {s['kl_theta_ref']:.3f}). Relative bias = "
        "||E[g] - grad KL_seq|| / ||grad KL_seq||; variance = trace of the covariance of a batch estimate of "
        f"B = {s['samples']} sequences; cosine between E[g] and grad KL_seq. Measured unbiased = relative bias < 1e-6. "
        f"Off-policy columns: the sampler is theta from {stale} optimizer steps earlier "
        f"(KL(pi || mu) = {s['sampler_kl_by_staleness'][str(stale)]:.3f}).",
        "",
        "Regenerate: `kljax bias-study --exact --out runs/bias --markdown docs/bias_table.md`.",
        "",
        "| configuration | measured unbiased | describe() | relative bias | variance | cosine | "
        f"off-policy (stale {stale}) unbiased | off-policy rel. bias | paper (arXiv 2512.21852) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["table"]:
        paper = PAPER.get(r["name"], "")
        lines.append(
            f"| `{r['name']}` | {'yes' if r['unbiased'] else 'no'} | "
            f"{'unbiased' if r['claimed_unbiased'] else 'biased'} | {_sci(r['relative_bias'])} | "
            f"{_sci(r['variance'])} | {r['cosine']:.3f} | "
            f"{'yes' if r['off_policy_unbiased'] else 'no'} | {_sci(r['off_policy_relative_bias'])} | {paper} |"
        )
    lines += ["", "Notes:", ""]
    lines += [f"  - {x.strip()}" if x.startswith("  ") else f"- {x}" for x in _findings({**result, "timing": {}})]
    lines += [
        "- Expected gradient of each configuration, in words (`describe`): "
        + "; ".join(f"`{r['name']}`: {r['gradient']}" for r in result["table"] if r["name"] in PAPER)
        + ".",
        "",
    ]
    return "\n".join(lines)


def write_markdown(result: Mapping[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown_table(result))
    return path
