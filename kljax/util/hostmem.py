"""Host-memory tuning for XLA on CPU: glibc's malloc asked for transparent huge pages (and, opt-in,
to keep freed memory).

Why: XLA CPU takes each execution's temporary buffer (GiBs for a train step) and its large outputs from
malloc; glibc serves a block above its mmap threshold (at most 32 MiB) with a fresh `mmap` and unmaps it
when freed, so every step faults those buffers in again, 4 KiB at a time, each page zeroed by the kernel.
With the tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35) malloc advises transparent huge pages for what
it maps, and the same memory faults in 2 MiB at a time. glibc reads GLIBC_TUNABLES once, at start-up, so
the `kljax` command re-executes itself once with it added (`reexec_with_malloc_tunables`); both sides of a
`kljax bench` run in that environment. KLJAX_HUGEPAGES=0 turns it off; tunables the user set are kept.

Opt-in, KLJAX_MALLOC_RETAIN=1 (`RETAIN_TUNABLES`): one arena grown by brk, no mmap'd blocks, no trimming,
so a buffer freed by one step is reused by the next without a fault (on a VM with free page reporting,
memory given back is slow to fault in again). The heap never shrinks and grows through fragmentation when
the per-step buffer is large: pair it with `rl.micro_batches`. Measured: docs/performance.md.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kljax.util.self_command import kljax_argv

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "KLJAX_HUGEPAGES"
RETAIN = "KLJAX_MALLOC_RETAIN"
# trim_threshold above any heap: at 2^32 - 1 glibc still trims a freed top chunk larger than 4 GiB,
# and a step's temporaries that large are faulted in again every step (docs/performance.md).
RETAIN_TUNABLES = (("glibc.malloc.arena_max", "1"), ("glibc.malloc.mmap_max", "0"),
                   ("glibc.malloc.trim_threshold", str(2**62)))
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def _glibc_version() -> tuple[int, ...] | None:
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    try:
        return tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return None


def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode (always, madvise, never), None if unknown."""
    try:
        text = _THP_MODE.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def tuned_environment(
    environ: Mapping[str, str], glibc: tuple[int, ...] | None, thp_mode: str | None, system: str = "linux"
) -> dict[str, str] | None:
    """The environment to re-execute with, or None when there is nothing to change.

    Adds glibc.malloc.hugetlb=1 unless: not Linux with glibc >= 2.35, transparent huge pages off or
    unknown, the user opted out (KLJAX_HUGEPAGES=0), or GLIBC_TUNABLES already sets it (any value,
    the user's choice). With KLJAX_MALLOC_RETAIN=1 (glibc >= 2.35 too) also adds each of
    `RETAIN_TUNABLES` that GLIBC_TUNABLES does not already set."""
    if not system.startswith("linux") or glibc is None or glibc < _MIN_GLIBC:
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    present = {item.split("=", 1)[0] for item in current.split(":") if item}
    wanted: list[tuple[str, str]] = []
    if thp_mode in ("always", "madvise") and environ.get(OPT_OUT, "1") != "0":
        wanted.append((TUNABLE, "1"))
    if environ.get(RETAIN, "0") == "1":
        wanted.extend(RETAIN_TUNABLES)
    added = [f"{name}={value}" for name, value in wanted if name not in present]
    if not added:
        return None
    env = dict(environ)
    env["GLIBC_TUNABLES"] = ":".join(([current] if current else []) + added)
    return env


ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")


def tpu_attached() -> bool:
    """Whether this host has TPU chips (their device files: /dev/accel* on v4, /dev/vfio/N on v5e,
    v5p and v6e VMs). libtpu installed without them (the `tpu` extra, for `kljax plan`) runs nothing."""
    import glob

    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def expects_cpu_backend(environ: Mapping[str, str], find_spec: Callable[[str], object] | None = None,
                        tpu_present: Callable[[], bool] = tpu_attached) -> bool:
    """Whether JAX will run on the CPU, decided before JAX is imported: JAX_PLATFORMS names cpu
    first, or (unset) no accelerator plugin is installed, libtpu counting only on a host with TPU
    chips (`tpu_attached`). The tuning here is for XLA CPU only."""
    import importlib.util

    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    find = find_spec or importlib.util.find_spec
    found = [name for name in ACCELERATOR_PLUGINS if find(name) is not None]
    return not found or (found == ["libtpu"] and not tpu_present())


def reexec_with_malloc_tunables(
    args: Sequence[str], execve: Callable[[str, list[str], dict[str, str]], object] = os.execve
) -> None:
    """Replace this process by `kljax ARGS` (`kljax.util.self_command`: never importing from the working
    directory) with the malloc tunables `tuned_environment`
    adds, if any, on a CPU backend (`expects_cpu_backend`); otherwise return and let the caller go on."""
    if not expects_cpu_backend(os.environ):
        return
    env = tuned_environment(os.environ, _glibc_version(), _thp_mode(), sys.platform)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()

    execve(sys.executable, kljax_argv(args), env)
