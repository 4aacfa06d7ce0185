"""Run-level safety: one run per workdir, no mixed resumes, damaged checkpoints fall back to an
intact one, no checkpoint with non-finite parameters, and linear answer extraction."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from kljax.api import RLTrainer
from kljax.boundary.workdir_lock import LOCK_NAME, WorkdirLock
from kljax.cli import main as cli_main
from kljax.config import load_run_config
from kljax.errors import UserError
from kljax.train import trainer as trainer_module
from kljax.train.checkpoint_integrity import damage
from kljax.train.metrics import read_jsonl
from kljax.train.trainer import train

MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def tiny(**overrides):
    # three checkpoints kept (the default keeps 2): the fall-back tests damage the newest two
    overrides = {**MESH, "eval_examples": 8, "checkpoint_every": 1, "keep_checkpoints": 3, **overrides}
    return load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in overrides.items()])


def state_files(step_dir):
    """The array files of a checkpoint step, largest first."""
    return sorted((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.stat().st_size > 64),
                  key=lambda p: -p.stat().st_size)


@pytest.fixture(scope="module")
def run3(tmp_path_factory):
    """A finished 3-step run with checkpoints at steps 1, 2, 3."""
    workdir = tmp_path_factory.mktemp("run3")
    train(tiny(steps=3), workdir, progress=False)
    return workdir


def test_lock_refuses_a_live_owner_and_takes_over_a_dead_one(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(UserError, match=f"in use by another run \\(pid {sleeper.pid}"):
            RLTrainer(config=tiny(steps=1), workdir=tmp_path, progress=False).train()  # the boundary's lock
        assert not (tmp_path / "checkpoints").exists()  # refused before anything was built
    finally:
        sleeper.kill()
        sleeper.wait()
    with WorkdirLock(tmp_path):  # the dead owner's lock is stale: taken over
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] != sleeper.pid
        with pytest.raises(UserError, match="in use by another run"):
            WorkdirLock(tmp_path).acquire()  # a second owner while this one holds it
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(UserError, match="locked by a run on host elsewhere"):
        WorkdirLock(tmp_path).acquire()


def test_two_cli_runs_on_one_workdir_one_is_refused(tmp_path):
    args = [sys.executable, "-m", "kljax", "train", "--config", "configs/tiny.py", "--workdir", str(tmp_path),
            "--no-progress", *[f"--config.{k}={v}" for k, v in MESH.items()], "--config.steps=3",
            "--config.eval_examples=8"]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (tmp_path / LOCK_NAME).exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run([*args, "--resume=auto"], capture_output=True, text=True, timeout=120)
    assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    assert second.returncode == 2, second.stderr[-2000:]
    assert "in use by another run" in second.stderr and "Traceback" not in second.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_resume_without_checkpoint_needs_auto(tmp_path):
    with pytest.raises(UserError, match="no checkpoint to resume from; pass --resume=auto"):
        train(tiny(steps=1), tmp_path / "empty", resume=True, progress=False)
    summary = train(tiny(steps=1), tmp_path / "auto", resume="auto", progress=False)
    assert "after" in summary and (tmp_path / "auto" / "checkpoints" / "1").is_dir()


@pytest.mark.parametrize("field,value", [("optim.learning_rate", 0.5), ("kl.beta", 0.5), ("seed", 7),
                                         ("kl.estimator", "k3"), ("rl.group_size", 8), ("model.dtype", "bfloat16")])
def test_resume_with_a_run_changing_field_is_refused(run3, field, value, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the run was built before the refusal")

    monkeypatch.setattr(trainer_module, "build", no_build)  # refused before the model is built
    with pytest.raises(UserError, match=f"would mix two runs: .*{field.replace('.', '[.]')}"):
        train(tiny(steps=4, **{field: value}), run3, resume=True, progress=False)


def test_flipped_bit_and_truncated_file_fall_back_to_an_intact_checkpoint(tmp_path, capsys):
    workdir = tmp_path / "run"
    train(tiny(steps=3), workdir, progress=False)
    ckpts = workdir / "checkpoints"
    flipped = state_files(ckpts / "3")[0]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    truncated = state_files(ckpts / "2")[0]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    assert damage(ckpts / "3") == f"file {flipped.relative_to(ckpts / '3')} does not match its sha256 (changed on disk)"
    assert "truncated" in damage(ckpts / "2") and damage(ckpts / "1") is None
    with pytest.raises(UserError, match="step 3 .* damaged .*does not match its sha256.*--resume=strict"):
        train(tiny(steps=4), workdir, resume="strict", progress=False)
    summary = train(tiny(steps=4), workdir, resume=True, progress=False)
    assert "after" in summary
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints.damaged").iterdir()) == ["2", "3"]
    assert [r["step"] for r in read_jsonl(workdir / "metrics.jsonl")] == [1, 2, 3, 4]  # resumed after step 1
    assert json.loads((workdir / "config.json").read_text())["steps"] == 4  # the safe change is recorded
    state_files(ckpts / "4")[0].write_bytes(b"")
    assert cli_main(["eval", "--checkpoint", str(workdir), "--no-progress"]) == 2  # eval verifies too
    assert "checkpoint at step 4" in capsys.readouterr().err


def test_poisoning_learning_rate_leaves_no_non_finite_checkpoint(tmp_path, capsys):
    # 1e39 overflows float32: every update would make the parameters inf or NaN.
    overrides = {**MESH, "eval_examples": 8, "checkpoint_every": 1, "keep_checkpoints": 3, "steps": 3,
                 "optim.learning_rate": 1e39}
    code = cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path), "--no-progress",
                     *[f"--config.{k}={v}" for k, v in overrides.items()]])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "kljax train: error: 3 steps in a row (up to step 3) had a non-finite loss, gradient or update" in err
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [1, 2, 3]
    for step in steps:
        tree = ocp.PyTreeCheckpointer().restore(tmp_path / "checkpoints" / str(step) / "state")
        for leaf in jax.tree.leaves(tree["train"]):
            assert np.all(np.isfinite(np.asarray(leaf, np.float64))), step
    assert all(r["nonfinite"] == 1.0 for r in read_jsonl(tmp_path / "metrics.jsonl"))


def test_answer_extraction_is_linear_on_deeply_nested_boxes():
    from kljax.tasks.answers import extract_final_answer, last_boxed

    cases = {
        "open": "\\boxed{" * 150_000,  # ~1 MB, never closed
        "closed": "\\boxed{" * 75_000 + "7" + "}" * 75_000,  # unwraps to 7
        "plain braces": "\\boxed{" + "{" * 500_000 + "}" * 500_000 + "}",
    }
    for name, text in cases.items():
        t0 = time.perf_counter()
        answer = extract_final_answer(text)
        assert time.perf_counter() - t0 < 5.0, name  # linear: ~0.1 s; the quadratic scan took minutes on 1 MB
        assert answer == {"open": None, "closed": "7", "plain braces": "{" * 500_000 + "}" * 500_000}[name], name
    assert last_boxed("x \\boxed{ \\boxed{a}+1 } y") == "\\boxed{a}+1"  # not one group: kept
    assert last_boxed("\\boxed{\\fbox{ 3 }}") == "3"
