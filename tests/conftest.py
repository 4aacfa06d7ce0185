"""Test set-up: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os
import signal

# A shell starts background jobs with SIGINT ignored, and exec'd children inherit that: the Ctrl-C
# tests (and the kljax subprocesses they interrupt) need Python's own handler wherever pytest was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from kljax.util.threads import ensure_collective_threads  # noqa: E402  (imports no JAX)

# Enough XLA client threads that 8 devices' collectives cannot starve (inherited by the kljax
# subprocesses of the tests): see kljax.util.threads.
ensure_collective_threads()


import pytest  # noqa: E402


@pytest.fixture
def cli_user_error(capsys):
    """`cli_user_error(argv, message)`: `kljax ARGV` exits 2 with one stderr line
    `kljax COMMAND: error: ...` that matches the regex `message`; returns that line."""
    import re

    from kljax.cli import main

    def check(argv: list[str], message: str) -> str:
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2, (rc, err)
        assert len(err.splitlines()) == 1 and err.startswith(f"kljax {argv[0]}: error: "), err
        assert re.search(message, err), (message, err)
        return err

    return check


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After a test module, drop JAX's in-memory compilations once the worker holds more than 4 GiB:
    a worker keeps every program of every module it ran otherwise (7+ GiB each late in the suite,
    beside the tests' kljax subprocesses on a 24 GiB machine). A later module recompiles or reads
    the persistent cache."""
    yield
    from kljax.train.trainer import host_memory_mb

    if host_memory_mb() > 4096:  # nan where /proc is absent: never
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
