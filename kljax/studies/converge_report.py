"""`kljax report DIR` for a converge-study directory (study.json + curves.json): DIR/report.md with
the final-gap table, each configuration's fixed point, the counts of where rows ended, and the
figures of `converge_plots` (gap curves per staleness level, the off-policy panel), then DIR/notes.md
(a person's reading of the results) when it exists."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kljax.errors import UserError, read_json
from kljax.studies import converge_plots as plots


def is_converge_dir(directory: str | Path) -> bool:
    """Whether `directory` holds a converge-study's study.json."""
    path = Path(directory) / "study.json"
    if not path.is_file():
        return False
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "converged_rule" in data.get("meta", {})


def _cell(r: Mapping[str, Any]) -> str:
    mark = {"pi*": "pi*", "fixed point": "fp", "boundary": "bnd", "diverged": "div", "not converged": "nc"}
    if r["final_gap_mean"] is None:
        return f"**nan {mark.get(r['converged_to'], '?')}**"
    text = f"{r['final_gap_mean']:.4f} ± {r['final_gap_std']:.4f} {mark.get(r['converged_to'], '?')}"
    return f"**{text}**" if r["unstable"] else text


def _counts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| async_level | rows with a KL term | unbiased: at pi* | biased: at pi* | biased: elsewhere "
             "(fixed point / boundary) | unstable with KL | unstable without KL |", "|---|---|---|---|---|---|---|"]
    for level in sorted({r["async_level"] for r in rows}):
        at = [r for r in rows if r["async_level"] == level]
        kl = [r for r in at if r["preset"] != "none"]
        unb = [r for r in kl if r["unbiased"]]
        bia = [r for r in kl if not r["unbiased"]]
        none = [r for r in at if r["preset"] == "none"]
        lines.append(
            f"| {level} | {len(kl)} | {sum(r['converged_to'] == 'pi*' for r in unb)} / {len(unb)} | "
            f"{sum(r['converged_to'] == 'pi*' for r in bia)} / {len(bia)} | "
            f"{sum(r['converged_to'] in ('fixed point', 'boundary') for r in bia)} / {len(bia)} | "
            f"{sum(r['unstable'] for r in kl)} / {len(kl)} | {sum(r['unstable'] for r in none)} / {len(none)} |")
    return lines


def command_line(meta: Mapping[str, Any]) -> str:
    """The `kljax converge-study` command that reruns the study of `meta` (the StudyConfig fields
    the CLI sets; the task's shape is the default one)."""
    def joined(values: Sequence[Any]) -> str:
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)

    return (f"kljax converge-study --presets {joined(meta['presets'])} --betas {joined(meta['betas'])} "
            f"--seeds {meta['seeds']} --async-levels {joined(meta['async_levels'])} --steps {meta['steps']} "
            f"--policy {meta['policy']} --learning-rate {meta['learning_rate']:g} "
            f"--fixed-point-iters {meta['fixed_point_iters']}")


def _fixed_point_table(presets: Sequence[str], betas: Sequence[float], by: Mapping[tuple, Mapping[str, Any]],
                       level: int) -> list[str]:
    out = ["gap of the fixed point, beta KL(pi_fp || pi*), and in % of the initial gap; pi*: below 1e-5 of it; "
           "'boundary': the parameters still moved at the end of the ascent; 'none found': it became non-finite "
           "(logits growing without bound).", "",
           "| configuration | " + " | ".join(f"beta {b:g}" for b in betas) + " |", "|---|" + "---|" * len(betas)]
    for p in presets:
        cells = []
        for b in betas:
            r = by.get((p, level, b))
            gap = None if r is None else r["fixed_point_gap"]
            if r is None:
                cells.append("")
            elif gap is None or not math.isfinite(gap):
                cells.append("none found (non-finite)")
            elif gap <= 1e-5 * r["initial_gap"]:
                cells.append(f"pi* ({max(gap, 0.0):.0e})")
            else:
                cells.append(f"{gap:.4f} ({100 * gap / r['initial_gap']:.2g}%)"
                             + (" boundary" if r["fixed_point_boundary"] else ""))
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    return out + [""]


def render(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """report.md's text (figures are referenced by file name)."""
    betas = sorted({r["beta"] for r in rows})
    levels = sorted({r["async_level"] for r in rows})
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    by = {(r["preset"], r["async_level"], r["beta"]): r for r in rows}
    out = [
        "# Convergence to the known optimum",
        "",
        f"Toy task: {len(meta['shapes'])} prompts ({', '.join(meta['shapes'])} rewards), vocabulary {meta['vocab']} "
        f"(the last token stops), responses of at most {meta['response_len']} tokens ({meta['num_responses']} per "
        f"prompt), a {meta['policy']} policy started at pi_ref. Each run: {meta['steps']} iterations of the "
        f"trainer's own update ({meta['advantage']}, {meta['aggregation']}, {meta['optimizer']}, peak learning rate "
        f"{meta['learning_rate']}), {meta['group_size']} samples per prompt; {meta['seeds']} seeds per row. "
        f"gap = beta KL(pi || pi*) = J(pi*) - J(pi), computed exactly at every step. "
        f"Study runtime: {meta['runtime_s']:.0f} s.",
        "",
        f"Rerun: `{command_line(meta)} --out DIR && kljax report DIR`",
        "",
        f"- Where a row ended: {meta['converged_rule']}.",
        f"- Unstable: {meta['unstable_rule']}.",
        "- verdict: `describe_objective` of the run's objective for J = E[R] - beta KL_seq at the row's beta "
        "(unbiased / scaled: the expected update is a positive multiple of grad J). 'no KL' rows follow grad E[R], "
        "not grad J: not unbiased for the J whose gap is measured (against the beta's pi* all the same).",
        "",
        "## Where the rows ended",
        "",
        *_counts(rows),
        "",
        "## Final gap (mean ± std over seeds; pi* / fp = the configuration's own fixed point / bnd = boundary / "
        "div = diverged / nc = not converged; bold: unstable)",
        "",
        "| configuration | async_level | verdict | " + " | ".join(f"beta {b:g}" for b in betas) + " |",
        "|---|---|---|" + "---|" * len(betas),
    ]
    for p in presets:
        for a in levels:
            cells = [by.get((p, a, b)) for b in betas]
            verdict = next((c["verdict"] for c in cells if c), "")
            out.append(f"| {p} | {a} | {verdict} | " + " | ".join(_cell(c) if c else "" for c in cells) + " |")
    out += ["", "Initial gap (pi_ref) per beta: " + ", ".join(
        f"{b:g}: {next(r['initial_gap'] for r in rows if r['beta'] == b):.4f}" for b in betas), "",
        "## Each configuration's fixed point (exact expected-gradient ascent, on-policy; staleness moves no fixed "
        "point)", ""]
    if not meta.get("fixed_point_iters", 1):
        out += ["Not computed (`--fixed-point-iters 0`).", ""]
    else:
        out += _fixed_point_table(presets, betas, by, levels[0])
    out += ["## Figures", ""]
    out += [f"![gap curves, async_level {a}](gap_curves_async{a}.png)" for a in levels]
    out += ["", "![off-policy panel](off_policy.png)", ""]
    return "\n".join(out)


def write_converge_report(directory: str | Path) -> Path:
    """DIR/report.md and its PNGs from DIR/study.json and DIR/curves.json (without curves.json the
    gap-curve PNGs are not redrawn), with DIR/notes.md appended when present; returns report.md's path."""

    d = Path(directory)
    study = read_json(d / "study.json", "converge study")
    if not isinstance(study, dict) or not study.get("rows"):
        raise UserError(f"{d / 'study.json'} has no rows; write it with `kljax converge-study --out {d}`")
    rows = study["rows"]
    if (d / "curves.json").is_file():  # absent (e.g. not committed): the gap-curve PNGs there are kept
        curves = read_json(d / "curves.json", "converge curves")
        for a in sorted({r["async_level"] for r in rows}):
            plots.gap_curves(rows, curves, a).savefig(d / f"gap_curves_async{a}.png", dpi=90)
    plots.off_policy_panel(rows).savefig(d / "off_policy.png", dpi=90)
    path = d / "report.md"
    text = render(study["meta"], rows).rstrip("\n") + "\n"
    if (d / "notes.md").is_file():  # a person's reading of the results, kept across re-renders
        text += "\n" + (d / "notes.md").read_text().strip() + "\n"
    path.write_text(text)
    return path
