"""Sweeps and reports: a tiny sweep (2-step runs through the trainer) is run, resumed and reported;
the instability rule on synthetic curves; the shipped experiment configs expand as documented."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest

from kljax.cli import main as cli_main
from kljax.studies.report import InstabilityRule, instability
from kljax.studies.sweep import _prepare, load_sweep, run_sweep
from kljax.util.owned_paths import MARKER

# The tiny config sharded over the 8 simulated devices (tests/conftest.py).
MESH = ["--config.mesh.data=1", "--config.mesh.fsdp=4", "--config.mesh.tensor=2"]
RUNS = ["none_onpolicy_s0", "k1-reward_b0.05_onpolicy_s0", "k3-loss_b0.05_onpolicy_s0",
        "full-both-rtg_b0.05_onpolicy_s0"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """configs/sweep_tiny.py: none, k1 in reward, k3 in loss and full-both-rtg (2 steps each)."""
    out = tmp_path_factory.mktemp("sweep")
    actions = run_sweep(load_sweep("configs/sweep_tiny.py", MESH), out, progress=False, log=lambda *_: None)
    assert actions == dict.fromkeys(RUNS, "ran")
    return out


def test_sweep_collects_curves_and_evaluations(sweep_dir):
    summary = json.loads((sweep_dir / "summary.json").read_text())
    runs = {r["name"]: r for r in summary["runs"]}
    assert set(runs) == set(RUNS)
    for name in RUNS:
        r = runs[name]
        assert r["status"] == "finished" and r["steps"] == [1, 2]
        assert {"reward", "kl_seq", "entropy", "grad_norm", "loss"} <= set(r["curves"])
        assert set(r["eval_after"]) == {"test"} and r["eval_before"]["test"]["n"] == 8
    assert runs["k3-loss_b0.05_onpolicy_s0"]["kl"]["estimator"] == "k3"
    assert "kl.beta=0.0" in runs["none_onpolicy_s0"]["overrides"]  # none runs once, whatever the betas
    assert runs["full-both-rtg_b0.05_onpolicy_s0"]["kl"]["estimator"] == "full"


def test_second_invocation_skips_finished_and_resumes_unfinished(sweep_dir):
    stamps = {n: os.stat(sweep_dir / "runs" / n / "eval_after.json").st_mtime_ns for n in RUNS}
    again = run_sweep(load_sweep("configs/sweep_tiny.py", MESH), sweep_dir, progress=False, log=lambda *_: None)
    assert [again[n] for n in RUNS] == ["skipped"] * len(RUNS)
    assert stamps == {n: os.stat(sweep_dir / "runs" / n / "eval_after.json").st_mtime_ns for n in RUNS}
    # An unfinished run (checkpoint, no final evaluation) resumes, here through a `kljax train` subprocess.
    (sweep_dir / "runs" / RUNS[1] / "eval_after.json").unlink()
    third = run_sweep(load_sweep("configs/sweep_tiny.py", MESH), sweep_dir, parallel=1, progress=False,
                      log=lambda *_: None)
    assert [third[n] for n in RUNS] == ["skipped", "resumed", "skipped", "skipped"]
    record = json.loads((sweep_dir / "runs" / RUNS[1] / "sweep_run.json").read_text())
    assert [i["how"] for i in record["invocations"]] == ["ran", "resumed"]
    assert len((sweep_dir / "runs" / RUNS[1] / "metrics.jsonl").read_text().splitlines()) == 2


def test_prepare_decides_skip_resume_restart(tmp_path):
    finished, partial, broken, new = (tmp_path / n for n in ("finished", "partial", "broken", "new"))
    finished.mkdir()
    (finished / "eval_after.json").write_text("{}")
    (partial / "checkpoints" / "4").mkdir(parents=True)
    (broken / "checkpoints" / "4.orbax-checkpoint-tmp-1").mkdir(parents=True)  # an unfinished write
    (broken / "metrics.jsonl").write_text('{"step": 1}\n')
    (broken / "sweep_run.json").write_text("{}")  # the sweep made it (an older kljax's record; now its marker)
    assert _prepare(finished) == (True, False)
    assert _prepare(partial) == (False, True)
    assert _prepare(broken) == (False, False) and os.listdir(broken) == [MARKER]  # started over from scratch
    assert _prepare(new) == (False, False) and os.listdir(new) == [MARKER]


def test_sft_directory_with_other_settings_is_refused(tmp_path):
    from kljax.train.sft import SFT_SUMMARY, SFTSettings, sft_warm_start

    old = SFTSettings(steps=5)
    (tmp_path / SFT_SUMMARY).write_text(json.dumps({"settings": dataclasses.asdict(old)}))
    assert sft_warm_start(old, tmp_path)["settings"]["steps"] == 5  # reused, nothing trained
    with pytest.raises(ValueError, match=r"other SFT settings \(differing: \['steps'\]\)"):
        sft_warm_start(SFTSettings(steps=6), tmp_path)


def test_report_tables_figures_and_rule(sweep_dir):
    assert cli_main(["report", str(sweep_dir)]) == 0
    text = (sweep_dir / "report.md").read_text()
    for needle in ("## Final greedy accuracy", "## Training curves", "## Unstable runs", "k1-reward_b0.05_onpolicy",
                   "full-both-rtg", "non-finite", "10 x max", "shared by every run", "`steps=2`"):
        assert needle in text, needle
    assert os.getcwd() + os.sep not in text  # a committed report names no path of this machine
    for png in ("final_accuracy.png", "curves_onpolicy.png"):
        assert (sweep_dir / "figures" / png).stat().st_size > 5_000
        assert f"figures/{png}" in text


def curves(n=50, kl0=0.1, **changes):
    c = {"loss": [0.1] * n, "kl_seq": [kl0] * n, "entropy": [1.0] * n, "grad_norm": [1.0] * n,
         "nonfinite": [0.0] * n}
    for key, edit in changes.items():
        c[key] = edit(list(c[key]))
    return c


def test_instability_rule():
    rule = InstabilityRule()
    assert instability(curves(), rule) == []
    assert "non-finite loss" in instability(curves(loss=lambda v: v[:10] + [math.nan] + v[11:]), rule)[0]
    assert "skipped" in instability(curves(nonfinite=lambda v: v[:-1] + [1.0]), rule)[0]
    # kl_seq 0.1 early; threshold 10 x 0.1 = 1: above it for the last 10% of steps -> blow-up.
    blown = instability(curves(kl_seq=lambda v: v[:40] + [2.0] * 10), rule)
    assert len(blown) == 1 and blown[0].startswith("KL blow-up")
    # A spike that comes back down is not a blow-up; nor is growth below the floor-based threshold.
    assert instability(curves(kl_seq=lambda v: v[:40] + [2.0] * 9 + [0.1]), rule) == []
    assert instability(curves(kl0=0.001, kl_seq=lambda v: v[:40] + [0.4] * 10), rule) == []
    collapsed = instability(curves(entropy=lambda v: v[:45] + [0.05] * 5), rule)
    assert len(collapsed) == 1 and collapsed[0].startswith("entropy collapse")


def test_experiment_configs_expand():
    small = load_sweep("configs/experiment_small.py")
    names = {p.kl_name for p in small.points}
    assert {"none", "k1-reward", "k3-reward", "k1-loss", "k2-loss", "k3-loss", "k3-both", "k2-loss-seq"} <= names
    runnable = [p for p in small.points if not p.unsupported]
    assert len(runnable) == (9 * 2 + 1) * 2 * 3  # 9 KL configs x 2 betas + none, x 2 variants x 3 seeds
    assert not [p for p in small.points if p.unsupported]
    assert {p.variant for p in runnable} == {"onpolicy", "async4"}
    assert small.spec["sft"]["task"] == "arithmetic"
    smollm = load_sweep("configs/experiment_smollm2.py")
    assert sorted(p.kl_name for p in smollm.points) == sorted(["none", "k1-reward", "k3-loss", "k1-loss",
                                                               "k3-reward"])
    assert all("ood" in o for p in smollm.points for o in p.overrides if o.startswith("task.eval_splits"))
