"""Run faults that must not pass silently: a checkpoint without its promised checksums, a resume with
no recorded config or a stretched learning-rate schedule, cut JSONL logs, a lost Ctrl-C, and the
non-finite error when the reward overflowed."""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kljax.api import RLTrainer
from kljax.config import load_run_config
from kljax.errors import UserError
from kljax.train import run_logs, trainer
from kljax.train.checkpoint_integrity import CHECKSUMS, PROMISE, damage
from kljax.train.metrics import read_jsonl
from kljax.train.resume_check import check_resume
from kljax.train.trainer import train

MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def tiny(**overrides):
    overrides = {**MESH, "eval_examples": 8, "checkpoint_every": 1, "log_samples_every": 1, "log_samples_n": 2,
                 **overrides}
    return load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in overrides.items()])


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    """A finished 2-step run: checkpoints 1 and 2, metrics.jsonl and samples.jsonl."""
    workdir = tmp_path_factory.mktemp("run2") / "run"
    train(tiny(steps=2), workdir, progress=False)
    return workdir


@pytest.fixture
def run_copy(run2, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run2, copy)
    (copy / "run.lock").unlink(missing_ok=True)
    return copy


def test_a_checkpoint_missing_its_promised_checksums_is_damaged(run_copy):
    step = run_copy / "checkpoints" / "2"
    assert json.loads((step / "meta" / "metadata").read_text())[PROMISE] is True
    (step / CHECKSUMS).unlink()  # as a kill between orbax's rename and the checksum write leaves it
    assert "checksums.json is missing" in damage(step)
    # An older kljax's checkpoint (no promise in its meta, no checksums) is still verified by orbax alone.
    meta = json.loads((step / "meta" / "metadata").read_text())
    del meta[PROMISE]
    (step / "meta" / "metadata").write_text(json.dumps(meta))
    assert damage(step) is None


def test_resume_falls_back_past_a_step_without_checksums(run_copy, capsys):
    (run_copy / "checkpoints" / "2" / CHECKSUMS).unlink()
    with pytest.raises(UserError, match="step 2 .* damaged .*checksums.json is missing"):
        train(tiny(steps=2), run_copy, resume="strict", progress=False)
    train(tiny(steps=2), run_copy, resume=True, progress=False)
    assert "checkpoint at step 2 is damaged (checksums.json is missing" in capsys.readouterr().err
    assert [r["step"] for r in read_jsonl(run_copy / "metrics.jsonl")] == [1, 2]  # step 2 run again


def test_resume_without_config_json_is_refused(run_copy):
    (run_copy / "config.json").unlink()
    with pytest.raises(UserError, match="config.json is missing, so nothing can check"):
        train(tiny(steps=2, **{"optim.learning_rate": 0.5}), run_copy, resume=True, progress=False)


def test_resume_that_stretches_a_decaying_schedule_is_refused():
    old = {"steps": 60, "optim": {"schedule": "cosine", "learning_rate": 1e-3}}
    longer = {"steps": 100, "optim": {"schedule": "cosine", "learning_rate": 1e-3}}
    with pytest.raises(UserError, match=r"cosine decay runs over optim.total_steps .* 60 -> 100.*total_steps=60"):
        check_resume(old, longer, "w")
    pinned = {"steps": 100, "optim": {"schedule": "cosine", "learning_rate": 1e-3, "total_steps": 60}}
    assert check_resume(old, pinned, "w") == ["steps"]  # the run's schedule kept: only its length of run grows
    with pytest.raises(UserError, match="linear decay"):
        check_resume({**old, "optim": {"schedule": "linear"}}, {**longer, "optim": {"schedule": "linear"}}, "w")
    constant = {"schedule": "constant", "learning_rate": 1e-3}
    assert check_resume({"steps": 60, "optim": constant}, {"steps": 100, "optim": constant}, "w") == ["steps"]


def test_cut_last_log_lines_are_repaired_on_resume_and_said(run_copy, capsys):
    for name in ("metrics.jsonl", "samples.jsonl"):
        with open(run_copy / name, "a") as f:
            f.write('{"step": 3, "completion": "12')  # killed while appending
    train(tiny(steps=3), run_copy, resume=True, progress=False)
    err = capsys.readouterr().err
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert f"{run_copy / name}: dropped its last line, cut short" in err
        assert [r["step"] for r in read_jsonl(run_copy / name)][-1] == 3
    assert [r["step"] for r in read_jsonl(run_copy / "metrics.jsonl")] == [1, 2, 3]


def test_truncate_jsonl_is_atomic_and_names_a_bad_line(tmp_path, monkeypatch):
    path = tmp_path / "samples.jsonl"
    original = "".join(json.dumps({"step": s, "x": "y" * 100}) + "\n" for s in (1, 2, 3, 4))
    path.write_text(original)

    def half_then_fail(self, data, *args, **kwargs):  # a kill (or a full disk) in the middle of the write
        with open(self, "w") as f:
            f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError):
        run_logs.truncate_jsonl(path, 2)
    monkeypatch.undo()
    assert path.read_text() == original  # the log is whole: old or new, never half
    assert run_logs.truncate_jsonl(path, 2) is None
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(UserError, match=f"{path}: line 2 is not a JSON object"):
        run_logs.truncate_jsonl(path, 3)


def test_a_sigint_inside_a_gc_callback_still_stops_the_run(tmp_path, monkeypatch):
    """A SIGINT handled inside a gc callback (as in JAX's): Python's handler raised KeyboardInterrupt
    there, printed as "Exception ignored" and lost; the run must stop anyway, with no such traceback."""
    fired, unraisable = [], []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def interrupt_in_gc(phase, info):
        if not fired and phase == "start" and (tmp_path / "checkpoints" / "1").is_dir():
            fired.append(True)
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the callback

    gc.callbacks.append(interrupt_in_gc)
    try:
        with pytest.raises(KeyboardInterrupt, match="interrupted .*checkpoint at step"):
            RLTrainer(config=tiny(steps=6), workdir=tmp_path, progress=False).train()  # the fault boundary's
    finally:
        gc.callbacks.remove(interrupt_in_gc)
    assert fired and not unraisable
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) < 6 and not (tmp_path / "eval_after.json").exists()


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "KLJAX_HUGEPAGES": "0"}
    args = ["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path), "--no-progress", "--config.steps=50",
            "--config.eval_examples=8", *[f"--config.{k}={v}" for k, v in MESH.items()]]
    proc = subprocess.Popen([sys.executable, "-m", "kljax", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()  # the objective line: start-up (model build, compiles) comes next
    assert "objective" in line
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 130, err[-3000:]
    assert lines[-1].startswith("kljax train: error: interrupted (Ctrl-C)"), err[-3000:]
    assert "Traceback" not in err


def test_non_finite_reward_is_named_not_the_learning_rate():
    row = {"loss": math.nan, "grad_norm": math.nan, "pg_loss": math.nan, "kl_loss": 0.0, "reward": math.inf,
           "rewards/huge/mean": math.inf, "rewards/huge/errors": 0.0}
    message = trainer._nonfinite_message(3, 3, row, 2, Path("w"))
    assert "non-finite reward (reward=inf, rewards/huge/mean=inf)" in message and "learning_rate" not in message
    row["reward"] = row["rewards/huge/mean"] = 0.5
    assert "optim.learning_rate" in trainer._nonfinite_message(3, 3, row, 2, Path("w"))


def test_an_interrupted_run_closes_its_files(tmp_path, monkeypatch):
    """However the loop ends (here a Ctrl-C at step 2), the trainer closes its loggers, checkpointer and
    reward workers before the KeyboardInterrupt leaves it: the CLI then ends the process at once."""
    from kljax.train.checkpoint import RunCheckpointer
    from kljax.train.events import LoopObserver
    from kljax.train.metrics import MetricsWriter

    closed = []
    for cls in (MetricsWriter, RunCheckpointer):
        monkeypatch.setattr(cls, "close", lambda self, _c=cls, _f=cls.close: (closed.append(_c), _f(self))[1])

    class CtrlCAtStep2(LoopObserver):
        def on_step_end(self, state, control):
            if state.global_step == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny(steps=4), tmp_path, progress=False, observers=[CtrlCAtStep2()])
    assert MetricsWriter in closed and RunCheckpointer in closed
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 1  # step 2's row is written after on_step_end
