"""Real faults: `kljax train` killed with SIGKILL at random moments (checkpoint writes included)
and resumed ends with the same parameters and metrics as an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp

from kljax.train.metrics import deterministic, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8
ARGS = ["--config", "configs/tiny.py", "--no-progress", f"--config.steps={STEPS}", "--config.checkpoint_every=1",
        "--config.eval_examples=8"]


def launch(workdir: Path, resume: bool) -> subprocess.Popen:
    # --resume=auto: a run killed before its first checkpoint leaves none to resume from.
    cmd = [sys.executable, "-m", "kljax", "train", "--workdir", str(workdir), *ARGS]
    cmd += ["--resume=auto"] if resume else []
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())


def final_params(workdir: Path) -> dict:
    step_dir = workdir / "checkpoints" / str(STEPS) / "state"
    tree = ocp.PyTreeCheckpointer().restore(step_dir)
    return tree["train"]["params"]


def stable(rows):
    return [deterministic(r) for r in rows]


def steps_done(workdir: Path) -> int:
    rows = read_jsonl(workdir / "metrics.jsonl") if (workdir / "metrics.jsonl").exists() else []
    return rows[-1]["step"] if rows else 0


def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path):
    clean = tmp_path / "clean"
    proc = launch(clean, resume=False)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:]

    faulty = tmp_path / "faulty"
    rng = random.Random(0)
    kills = 0
    resume = False
    deadline = time.time() + 600
    while time.time() < deadline:
        proc = launch(faulty, resume=resume)
        resume = True
        if kills < 3:
            # Wait until the run is training, then kill it a random moment later (often mid-checkpoint,
            # since this config checkpoints after every step).
            start = steps_done(faulty)
            while proc.poll() is None and steps_done(faulty) <= start and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.3))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        rc = proc.wait(timeout=600)
        assert rc == 0, proc.stderr.read().decode()[-2000:]
        if steps_done(faulty) >= STEPS and (faulty / "eval_after.json").exists():
            break
    assert kills >= 1, "the run finished before any kill: the test did not exercise a fault"
    a, b = final_params(clean), final_params(faulty)
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert stable(read_jsonl(clean / "metrics.jsonl")) == stable(read_jsonl(faulty / "metrics.jsonl"))
    # No partially written checkpoint is ever visible: every step directory is complete.
    for step_dir in (faulty / "checkpoints").iterdir():
        if step_dir.name.isdigit():
            assert (step_dir / "state").is_dir() and (step_dir / "meta").is_dir(), step_dir


def _leaves(tree):
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _leaves(tree[k])]
    return [np.asarray(tree)]
