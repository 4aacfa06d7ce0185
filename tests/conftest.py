"""Test set-up: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from kljax.cpu_threads import ensure_collective_threads  # noqa: E402  (imports no JAX)

# Enough XLA client threads that 8 devices' collectives cannot starve (inherited by the kljax
# subprocesses of the tests): see kljax.cpu_threads.
ensure_collective_threads()
