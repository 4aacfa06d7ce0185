"""Test set-up: 8 simulated CPU devices, set before JAX is imported anywhere.

The 8 devices are threads on (in CI) 2 cores shared with a second pytest worker, so a collective
can wait for a starved device thread far longer than on real hardware: XLA CPU aborts the process
when one waits over 40 s (`xla_cpu_collective_call_terminate_timeout_seconds`; seen once in
tests/test_faults.py's subprocess under full load), so the tests allow 600 s. The flags reach the
`kljax` subprocesses that tests start through the environment.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_cpu_collective_call_terminate_timeout_seconds=600"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
