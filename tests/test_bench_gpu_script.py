"""launch/bench_gpu.sh in its CPU smoke mode: tiny sizes, every JSON written, peak from the chip table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "bench_gpu.sh"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]  # this venv's kljax and python3
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's shell would have
    return subprocess.run(["bash", str(SCRIPT), "--cpu-smoke", *args, str(out)], env=env, capture_output=True,
                          text=True, timeout=240)


def test_cpu_smoke_runs_benchmarks_and_skips_missing_ones(tmp_path):
    out = tmp_path / "bench"
    proc = _run(out, "--benches", "train,kl,nosuch", "--gpu-name", "NVIDIA H200")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipping nosuch: `kljax bench nosuch` does not exist" in proc.stdout
    train = json.loads((out / "train_tiny.json").read_text())
    assert train["peak_gflops"] == 989000 and train["loss_check"]["ok"]
    assert 0 < train["mfu"] <= 1.5 and train["ratio"] == pytest.approx(train["kljax"] / train["peer"])
    assert train["settings"]["model"].startswith("random:qwen2.5-0.5b:")
    kl = json.loads((out / "kl_shapes.json").read_text())
    assert kl["ratio"] > 0 and all(row["check"]["ok"] for row in kl["cases"].values())
    summary = (out / "summary.txt").read_text()
    assert "train_tiny" in summary and "kl_shapes" in summary and "mfu" in summary


def test_budget_exhausted_skips_with_a_message(tmp_path):
    proc = _run(tmp_path / "bench", "--benches", "train", "--budget", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipping train tiny" in proc.stdout and "budget left" in proc.stdout
    assert not (tmp_path / "bench" / "train_tiny.json").exists()
