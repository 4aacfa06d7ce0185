"""Enough XLA CPU client threads for a collective when one process simulates several CPU devices.

With `--xla_force_host_platform_device_count=N` (N > 1: the tests, `kljax plan`, a user trying a
mesh on a laptop) a sharded program's N per-device parts meet in XLA CPU's in-process
collectives, and each part waits there on a thread of the PjRt CPU client's pool. That pool has
max(PJRT_NPROC or the core count, N) threads: exactly N on a machine with fewer cores than
devices, "enough for one collective". The same pool also runs the launches of the next programs,
and a launch waits there too when its device already has its maximum of computations in flight.
When the host dispatches many small sharded programs (eager `jnp` ops on sharded arrays) right
after a collective one, such waiting launches can take pool threads before the collective's last
parts get one: those parts never start, the others wait for them, and XLA aborts the process
("Termination timeout ... Expected N threads to join the rendezvous", or hangs as long as the
timeout allows). Seen here as a `kljax train` subprocess of the tests aborting about once in 30
runs with "only 6 of 8 arrived"; a gdb dump of a hung run showed 7 pool threads in the all-reduce
and the 8th blocked in a launch's semaphore. Reproduced with two processes at once, each running
a small collective step on 8 devices followed by 40 eager sharded ops, 1500 times: 10 aborts in 10
runs (with JAX's asynchronous CPU dispatch on or off; 1 in 2 with 150 ops and 300 steps). With a
4N-thread pool (PJRT_NPROC, read by XLA when it creates the client) all 12 runs finished (40 or 150
ops).

    ensure_collective_threads(environ) sets PJRT_NPROC = max(cores, 4 N) when XLA_FLAGS forces
    N > 1 host devices and PJRT_NPROC is not set; it returns the value used (None: no change).

Call it before JAX creates its CPU client (the `kljax` command and tests/conftest.py do). Single-
device runs are left alone. PJRT_NPROC also sizes XLA CPU's intra-op pool, so simulated-device
runs get more threads than cores; they are for checking sharding, not for speed.
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
