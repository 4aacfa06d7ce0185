"""Enough XLA CPU client threads for a collective when one process simulates several CPU devices.

With `--xla_force_host_platform_device_count=N` (N > 1: the tests, `kljax plan`, a mesh tried on a laptop) a
sharded program's N per-device parts meet in XLA CPU's in-process collectives, each waiting on a thread of
the PjRt CPU client's pool: max(PJRT_NPROC or the core count, N) threads, exactly N with fewer cores than
devices. The same pool runs the launches of the next programs, and a launch waits there too when its device
already has its maximum of computations in flight; after a collective program, eager sharded ops can take
the threads its last parts need, and XLA aborts ("Termination timeout ... Expected N threads to join the
rendezvous") or hangs. A pool of 4N threads avoids it (docs/performance.md, docs/host_tuning.md).

    ensure_collective_threads(environ) sets PJRT_NPROC = max(cores, 4 N) when XLA_FLAGS forces
    N > 1 host devices and PJRT_NPROC is not set; it returns the value used (None: no change).

Call it before JAX creates its CPU client (the `kljax` command and tests/conftest.py do); single-device runs
are left alone. PJRT_NPROC also sizes the intra-op pool: simulated devices are for sharding, not speed.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

ENV = "PJRT_NPROC"
THREADS_PER_DEVICE = 4
FORCE_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def forced_device_count(xla_flags: str) -> int:
    """The last --xla_force_host_platform_device_count in XLA_FLAGS (1 if absent)."""
    found = FORCE_FLAG.findall(xla_flags)
    return int(found[-1]) if found else 1


def without_forced_devices(xla_flags: str) -> str:
    """XLA_FLAGS with every --xla_force_host_platform_device_count removed."""
    return " ".join(FORCE_FLAG.sub("", xla_flags).split())


def ensure_collective_threads(environ: MutableMapping[str, str] | None = None,
                              cores: int | None = None) -> int | None:
    """Set PJRT_NPROC for simulated multi-device CPU runs (see the module docstring)."""
    environ = os.environ if environ is None else environ
    devices = forced_device_count(environ.get("XLA_FLAGS", ""))
    if devices <= 1 or environ.get(ENV):
        return None
    threads = max(cores if cores is not None else (os.cpu_count() or 1), THREADS_PER_DEVICE * devices)
    environ[ENV] = str(threads)
    return threads
