"""A reward function run in this process cannot end or break the run without a word (#41): os._exit
and closing the run's file descriptors (standard streams included) stop the run with one line naming
the function, with the standard streams restored so that line is printed; a segmentation fault, which
the process cannot survive, is one line from the crash watcher naming the function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from error_lines import the_error_line

from kljax.boundary.reward_guard import in_process_guard
from kljax.tasks import get_task
from kljax.tasks.base import Example
from kljax.train.reward_set import RewardFunctionError, RewardSet

ROOT = Path(__file__).resolve().parents[1]


def _train(tmp_path: Path, fn: str) -> list[str]:
    return [sys.executable, "-m", "kljax", "train", "--config", "configs/tiny.py", "--no-progress",
            "--config.eval_examples=4", "--config.steps=2", f"--config.reward.functions={tmp_path / 'r.py'}:{fn}",
            "--workdir", str(tmp_path / "run")]


def examples(n=3):
    return [Example(f"{i}+1=", str(i + 1), "repeat_digit", "train", f"train-{i}", {}) for i in range(n)]


def exits_quietly(completions, **kwargs):
    try:
        os._exit(3)
    except Exception:  # noqa: BLE001 - a function that swallows errors must not swallow this
        pass
    return [1.0] * len(completions)


def test_os_exit_in_process_is_one_line_naming_the_function_and_os_exit_comes_back():
    real_exit = os._exit
    rs = RewardSet(get_task("repeat_digit"), [("exits_quietly", exits_quietly)], [1.0], on_error="skip",
                   guard=in_process_guard)  # the boundary's guard, as the CLI and the API give it
    with pytest.raises(RewardFunctionError, match=r"'exits_quietly' .*called os._exit\(3\); the run stops"):
        rs(examples(), ["1", "2", "3"])
    assert os._exit is real_exit


def test_a_function_that_closes_descriptors_stops_the_run_in_one_line(tmp_path):
    """Run in a child `kljax train`: the function closes every descriptor but the standard streams'
    (the run's lock, logs, JAX's), then the standard streams too on the next call."""
    (tmp_path / "r.py").write_text(
        "import os\n"
        "def closes(completions, **kw):\n"
        "    os.closerange(0, 4096)  # all but the guard's copies of the standard streams\n"
        "    return [0.0] * len(completions)\n")
    done = subprocess.run(_train(tmp_path, "closes"), cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KLJAX_HUGEPAGES": "0"})
    assert done.returncode == 2, done.stderr[-3000:]
    line = the_error_line(done.stderr, "train")
    assert line.startswith("kljax train: error: reward function 'closes'"), line
    assert "closed file descriptors [0, 1, 2" in line


def test_a_crash_in_process_is_one_line_naming_the_function(tmp_path):
    """A segmentation fault cannot be survived in process; the watcher names the function (was: rc 139
    and nothing)."""
    (tmp_path / "r.py").write_text("import ctypes\ndef crash(completions, **kw):\n    return ctypes.string_at(0)\n")
    done = subprocess.run(_train(tmp_path, "crash"), cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KLJAX_HUGEPAGES": "0"})
    assert done.returncode == -11, done.stderr[-3000:]
    line = the_error_line(done.stderr, "train")
    assert line.startswith("kljax train: error: the process died of a Segmentation fault in reward function "
                           f"'crash' ({tmp_path / 'r.py'}:crash)"), line
    assert "Fatal Python error" not in done.stderr
