"""`kljax bias-study` end to end on a tiny setting: JSON, CSV and PNG files with the required keys,
the printed table, and the regenerable markdown table."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from kljax import cli
from kljax.studies.bias import report
from kljax.verdicts.kl import describe
from kljax.verdicts.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "bias_tiny.py")
ENTRY_KEYS = {"name", "unbiased", "relative_bias", "variance", "cosine", "mse", "gradient", "claimed_unbiased"}


def test_cli_writes_json_csv_png_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "study"
    code = cli.main(
        [
            "bias-study",
            "--config",
            TINY,
            "--out",
            str(out),
            "--json",
            str(tmp_path / "entries.json"),
            "--markdown",
            str(tmp_path / "table.md"),
            "--seed",
            "3",
            "--config.repeats=32",
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "configuration" in printed and "k1-reward" in printed and "Rao-Blackwellization" in printed

    entries = json.loads((tmp_path / "entries.json").read_text())
    assert [e["name"] for e in entries] == [describe(c).name for c, _ in PRESETS]
    for e in entries:
        assert ENTRY_KEYS <= set(e), set(e)
        assert e["unbiased"] == e["claimed_unbiased"], e["name"]  # measured (exact) == describe()
        assert (e["relative_bias"] < 1e-6) == e["unbiased"]
        assert e["mse"] >= e["variance"] >= 0

    study = json.loads((out / "study.json").read_text())
    assert {"settings", "table", "records", "offpolicy", "timing"} <= set(study)
    assert study["settings"]["seed"] == 3 and study["settings"]["repeats"] == 32
    figures = {r["figure"] for r in study["records"]}
    assert figures == {"vs_length", "vs_samples", "vs_staleness", "vs_alpha", "vs_beta", "rao_blackwell"}
    assert {r["mode"] for r in study["records"]} == {"exact", "montecarlo"}

    with (out / "table.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(PRESETS) and ENTRY_KEYS <= set(rows[0])
    with (out / "figures.csv").open() as f:
        header = next(csv.reader(f))
    assert {"figure", "config", "mode", "relative_bias", "variance", "mse", "cosine"} <= set(header)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {
        "bias_variance_vs_length.png",
        "bias_variance_vs_samples.png",
        "cosine_vs_staleness.png",
        "rao_blackwell.png",
        "offpolicy_tradeoff.png",
    } <= set(pngs)
    assert all((out / p).stat().st_size > 5000 for p in pngs)
    md = (tmp_path / "table.md").read_text()
    assert "| `k3-reward` | no | biased |" in md and "training collapsed" in md


def test_cli_monte_carlo_mode_with_samples_flag(tmp_path, capsys):
    """--samples N alone selects Monte-Carlo mode; the table is then measured by sampling."""
    path = tmp_path / "entries.json"
    code = cli.main(
        [
            "bias-study",
            "--config",
            TINY,
            "--samples",
            "4",
            "--repeats",
            "64",
            "--configs",
            "k1-reward,k3-loss,k1-loss",
            "--json",
            str(path),
            "--no-progress",
        ]
    )
    assert code == 0
    entries = {e["name"]: e for e in json.loads(path.read_text())}
    assert set(entries) == {"k1-reward", "k3-loss", "k1-loss"}
    assert all(e["measured_by"] == "montecarlo" and e["samples"] == 4 for e in entries.values())
    assert entries["k1-loss"]["unbiased"] is False  # relative bias ~1, far beyond its standard error
    assert "Monte Carlo" in capsys.readouterr().out


def test_docs_table_is_generated_from_a_study():
    """docs/bias_table.md is report.markdown_table's output: every preset, measured next to the paper."""
    text = (ROOT / "docs" / "bias_table.md").read_text()
    assert text.startswith("# KL-gradient bias of each configuration, measured")
    for config, _ in PRESETS:
        assert f"| `{describe(config).name}` |" in text
    for words in report.PAPER.values():
        assert words in text
