"""Host-memory tuning for XLA on CPU: glibc's malloc asked for transparent huge pages (and, opt-in,
to keep freed memory).

Why: XLA CPU takes each execution's temporary buffer (GiBs for a train step) and its large outputs
from malloc. glibc serves a block above its mmap threshold (at most 32 MiB) with a fresh `mmap`
and gives it back with `munmap` when freed, so every step faults every page of those buffers in
again, 4 KiB at a time, each zeroed by the kernel. Measured on the SmolLM2 update of `kljax bench
train` (16 x 256, float32, 2 cores): 3.2 M minor faults (12 GiB) and 8-10 s of kernel time per
26-28 s step. With the glibc tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35) malloc advises
transparent huge pages for what it maps, and the same memory faults in 2 MiB at a time: about
0.2 M faults, 4-5 s of kernel time, 24-26 s per step; a whole `kljax bench rl` iteration went from
48 to 39 s.

glibc reads GLIBC_TUNABLES once, when the process starts, so the `kljax` command re-executes itself
once with it added (`reexec_with_malloc_tunables`), before anything else runs. Both sides of every
`kljax bench` run in that environment (the peer in the same process, or in a child that inherits
it). Set KLJAX_HUGEPAGES=0 to turn this off; an explicit glibc.malloc.hugetlb setting is kept.

Opt-in, KLJAX_MALLOC_RETAIN=1: also keep freed memory in the process (`RETAIN_TUNABLES`: one malloc
arena that grows by brk, no mmap'd blocks, no trimming), so a buffer freed by one step is reused by
the next without any page fault. Why it matters beyond the fault count: on a VM with free page
reporting (virtio-balloon; `/sys/module/page_reporting`), memory a process gives back is returned
to the hypervisor within seconds, and touching it again costs a host fault per page: measured here,
fresh pages came in at 0.4-0.7 GB/s instead of ~9 GB/s for recently freed ones, and an RL update
took 28 s inside an iteration (after sampling and scoring) against 22 s back to back. The cost:
the heap never shrinks and can grow through fragmentation when XLA's per-step temporary buffer is
large (an 8.9 GiB one grew the heap by 9 GiB), so use it with `rl.micro_batches` keeping that
buffer small (2 GiB at 8 micro-batches of the `kljax bench rl` update, where the iteration went
from 36 to 32-35 s and the peak RSS from 5.1 to 4.9 GiB). Tunables the user set are kept.
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
# trim_threshold above any heap: at 2^32 - 1 glibc still trimmed a freed top chunk larger than
# 4 GiB, so the bf16 SmolLM2 update's 4.7 GiB of XLA temporaries were faulted in again every step
# (2654 two-MiB faults, 7.8 s of kernel time in an 11 s update); at 2^62 steady steps took 7.1 s.
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
