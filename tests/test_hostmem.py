"""`kljax.util.hostmem`: when the `kljax` command re-executes itself with glibc's huge-page malloc tunable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kljax.util import hostmem
from kljax.util.hostmem import RETAIN_TUNABLES, TUNABLE, tuned_environment
from kljax.util.self_command import kljax_argv

GLIBC = (2, 36)


def test_adds_the_tunable_and_keeps_the_users_other_ones():
    env = tuned_environment({"PATH": "/bin"}, GLIBC, "madvise")
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": f"{TUNABLE}=1"}
    env = tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, GLIBC, "always")
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}=1"


def test_retain_opt_in_adds_the_tunables_the_user_did_not_set():
    retain = ":".join(f"{n}={v}" for n, v in RETAIN_TUNABLES)
    env = tuned_environment({"KLJAX_MALLOC_RETAIN": "1"}, GLIBC, "madvise")
    assert env["GLIBC_TUNABLES"] == f"{TUNABLE}=1:{retain}"
    # no huge pages possible (or opted out): retention alone
    assert tuned_environment({"KLJAX_MALLOC_RETAIN": "1"}, GLIBC, "never")["GLIBC_TUNABLES"] == retain
    env = tuned_environment({"KLJAX_MALLOC_RETAIN": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, GLIBC, "always")
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.arena_max=4", f"{TUNABLE}=1",  # the user's arena_max kept
                                                *(f"{n}={v}" for n, v in RETAIN_TUNABLES[1:])]
    # the re-executed process has them all: nothing more to add, no second re-exec
    assert tuned_environment({"KLJAX_MALLOC_RETAIN": "1", "GLIBC_TUNABLES": env["GLIBC_TUNABLES"]}, GLIBC,
                             "always") is None
    assert tuned_environment({"KLJAX_MALLOC_RETAIN": "0"}, GLIBC, "madvise")["GLIBC_TUNABLES"] == f"{TUNABLE}=1"


@pytest.mark.parametrize("environ, glibc, thp, system", [
    ({"GLIBC_TUNABLES": f"{TUNABLE}=0"}, GLIBC, "madvise", "linux"),  # the user's own setting wins
    ({"GLIBC_TUNABLES": f"glibc.malloc.arena_max=1:{TUNABLE}=2"}, GLIBC, "madvise", "linux"),
    ({"KLJAX_HUGEPAGES": "0"}, GLIBC, "madvise", "linux"),  # opted out
    ({}, (2, 34), "madvise", "linux"),  # glibc before the tunable existed
    ({}, None, "madvise", "linux"),  # musl or unknown libc
    ({}, GLIBC, "never", "linux"),  # transparent huge pages off
    ({}, GLIBC, None, "linux"),
    ({}, GLIBC, "always", "darwin"),
    ({"KLJAX_MALLOC_RETAIN": "1"}, (2, 34), "madvise", "linux"),
    ({"KLJAX_MALLOC_RETAIN": "1"}, GLIBC, "always", "darwin"),
])
def test_no_reexec_when_it_cannot_help_or_the_user_chose(environ, glibc, thp, system):
    assert tuned_environment(environ, glibc, thp, system) is None


def test_reexec_runs_kljax_with_the_same_arguments(monkeypatch):
    calls = []
    monkeypatch.setattr(hostmem, "_glibc_version", lambda: GLIBC)
    monkeypatch.setattr(hostmem, "_thp_mode", lambda: "madvise")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("KLJAX_HUGEPAGES", raising=False)
    hostmem.reexec_with_malloc_tunables(["train", "--workdir", "w"], execve=lambda *a: calls.append(a))
    (path, argv, env), = calls
    assert path == sys.executable and argv == kljax_argv(["train", "--workdir", "w"])  # not from the cwd
    assert env["GLIBC_TUNABLES"] == f"{TUNABLE}=1"
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])  # the re-executed process does not loop
    hostmem.reexec_with_malloc_tunables(["train"], execve=lambda *a: calls.append(a))
    assert len(calls) == 1


@pytest.mark.skipif(hostmem.tuned_environment({}, hostmem._glibc_version(), hostmem._thp_mode(), sys.platform)
                    is None, reason="no glibc >= 2.35 with transparent huge pages here")
def test_the_kljax_command_reexecutes_once_with_the_tunable(tmp_path):
    """End to end: every Python process started records GLIBC_TUNABLES (a sitecustomize on
    PYTHONPATH); `python -m kljax --help` is two processes, the second with the tunable, and prints
    the same help as with KLJAX_HUGEPAGES=0 (one process)."""
    log = tmp_path / "tunables.txt"
    (tmp_path / "sitecustomize.py").write_text(
        f"import os\nwith open({str(log)!r}, 'a') as f:\n    f.write(repr(os.environ.get('GLIBC_TUNABLES')) + '\\n')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "KLJAX_HUGEPAGES")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    run = lambda extra: subprocess.run([sys.executable, "-m", "kljax", "--help"], env={**env, **extra},
                                       capture_output=True, text=True, check=True).stdout
    tuned = run({})
    assert log.read_text().splitlines() == ["None", repr(f"{TUNABLE}=1")]
    log.unlink()
    assert run({"KLJAX_HUGEPAGES": "0"}) == tuned and "COMMAND" in tuned
    assert log.read_text().splitlines() == ["None"]


def test_host_tuning_only_for_a_cpu_backend(monkeypatch):
    """Decided before JAX starts: JAX_PLATFORMS first, else whether an accelerator plugin is installed."""
    none = lambda name: None
    assert hostmem.expects_cpu_backend({}, none)
    assert hostmem.expects_cpu_backend({"JAX_PLATFORMS": "cpu"}, lambda name: object())
    assert not hostmem.expects_cpu_backend({"JAX_PLATFORMS": "cuda,cpu"}, none)
    assert not hostmem.expects_cpu_backend({}, lambda name: object() if name == "jax_cuda12_plugin" else None)
    libtpu = lambda name: object() if name == "libtpu" else None  # the tpu extra: only a TPU VM runs on it
    assert hostmem.expects_cpu_backend({}, libtpu, tpu_present=lambda: False)
    assert not hostmem.expects_cpu_backend({}, libtpu, tpu_present=lambda: True)
    calls = []
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    hostmem.reexec_with_malloc_tunables(["train"], execve=lambda *a: calls.append(a))
    assert calls == []
