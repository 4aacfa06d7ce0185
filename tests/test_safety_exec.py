"""Nothing runs from the working directory: every way kljax starts itself again (the malloc-tunable
re-exec of the `kljax` command, `kljax plan`'s child with simulated devices, `kljax sweep --parallel`'s
train processes) imports the standard library, not a json.py / argparse.py where the user stands."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kljax.cli import plan as plan_cli
from kljax.studies import sweep as sweep_mod
from kljax.util import hostmem

SHADOWED = ("json", "argparse", "dataclasses")


def _hostile_cwd(path: Path) -> Path:
    """A directory whose json.py, argparse.py, ... write path/EXECUTED when imported."""
    for name in SHADOWED:
        (path / f"{name}.py").write_text(f"open({str(path / 'EXECUTED')!r}, 'a').write('{name}\\n')\n")
    return path


def _run_prefix(prefix: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`PREFIX kl-configs` in `cwd` (the kljax command line a re-exec path builds, with a cheap command)."""
    return subprocess.run([*prefix, "kl-configs"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _assert_clean(result: subprocess.CompletedProcess, cwd: Path) -> None:
    assert result.returncode == 0, result.stderr[-2000:]
    assert "KL part" in result.stdout
    executed = (cwd / "EXECUTED").read_text().split() if (cwd / "EXECUTED").exists() else []
    assert not executed, f"imported from the working directory: {executed}"


def test_kljax_command_reexec_imports_nothing_from_the_working_directory(tmp_path):
    env = {**os.environ, "KLJAX_MALLOC_RETAIN": "1", "JAX_PLATFORMS": "cpu"}
    env.pop("GLIBC_TUNABLES", None)
    if hostmem.tuned_environment(env, hostmem._glibc_version(), hostmem._thp_mode(), sys.platform) is None:
        pytest.skip("no glibc >= 2.35 here: the kljax command does not re-execute itself")
    kljax = Path(sys.executable).with_name("kljax")
    if not kljax.is_file():
        pytest.skip("the kljax console script is not installed next to this interpreter")
    cwd = _hostile_cwd(tmp_path)
    _assert_clean(subprocess.run([str(kljax), "kl-configs"], cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=120), cwd)


def test_hostmem_reexec_command_line(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setenv("KLJAX_MALLOC_RETAIN", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(hostmem, "_glibc_version", lambda: (2, 36))
    hostmem.reexec_with_malloc_tunables(["kl-configs"], execve=lambda exe, argv, env: seen.append(argv))
    assert seen and seen[0][-1] == "kl-configs"
    cwd = _hostile_cwd(tmp_path)
    _assert_clean(_run_prefix(seen[0][:-1], cwd), cwd)


def test_plan_child_command_line(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(plan_cli.subprocess, "call", lambda argv, env=None: seen.append(argv) or 0)
    parser = argparse.ArgumentParser()
    plan_cli.configure(parser)
    args = parser.parse_args(["--mesh", "fsdp=4", "--programs", "train", "--top", "0", "--no-roofline"])
    args.overrides = []
    plan_cli._reexec(args, 4)
    child = plan_cli._child_argv(args, 4)
    assert "--no-roofline" in child
    assert seen[0][-len(child):] == child
    cwd = _hostile_cwd(tmp_path)
    _assert_clean(_run_prefix(seen[0][:-len(child)], cwd), cwd)


def test_sweep_train_subprocess_command_line(tmp_path):
    sweep = sweep_mod.sweep_from_spec({"base_config": "tiny.py", "kl": ["k1-reward"], "beta": [0.1]})
    point = sweep.points[0]
    argv = sweep_mod._command(sweep, point, tmp_path / "run", resume=False)
    cut = argv.index("train")
    cwd = _hostile_cwd(tmp_path)
    _assert_clean(_run_prefix(argv[:cut], cwd), cwd)
