"""`kljax.util.threads`: simulated multi-device CPU runs get a client pool big enough for a collective."""

import os

from kljax.util import threads as cpu_threads


def test_forced_device_count_reads_the_last_flag():
    assert cpu_threads.forced_device_count("") == 1
    assert cpu_threads.forced_device_count("--xla_dump_to=/tmp/x") == 1
    flags = "--xla_force_host_platform_device_count=2 --xla_dump_to=/x --xla_force_host_platform_device_count=8"
    assert cpu_threads.forced_device_count(flags) == 8


def test_sets_four_threads_per_simulated_device_unless_told():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert cpu_threads.ensure_collective_threads(env, cores=2) == 32
    assert env["PJRT_NPROC"] == "32"
    # many cores: the core count, as XLA would use anyway
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert cpu_threads.ensure_collective_threads(env, cores=64) == 64
    # the user's own setting is kept
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "9"}
    assert cpu_threads.ensure_collective_threads(env, cores=2) is None
    assert env["PJRT_NPROC"] == "9"


def test_single_device_runs_are_left_alone():
    for flags in ("", "--xla_force_host_platform_device_count=1"):
        env = {"XLA_FLAGS": flags} if flags else {}
        assert cpu_threads.ensure_collective_threads(env, cores=2) is None
        assert "PJRT_NPROC" not in env


def test_the_suite_runs_with_the_bigger_pool():
    # tests/conftest.py calls it before JAX starts; the kljax subprocesses of the tests inherit it
    devices = cpu_threads.forced_device_count(os.environ["XLA_FLAGS"])
    assert devices == 8
    assert int(os.environ["PJRT_NPROC"]) >= cpu_threads.THREADS_PER_DEVICE * devices


def test_without_forced_devices_drops_only_that_flag():
    flags = "--xla_force_host_platform_device_count=8 --xla_dump_to=/x  --xla_force_host_platform_device_count=2"
    assert cpu_threads.without_forced_devices(flags) == "--xla_dump_to=/x"
    assert cpu_threads.without_forced_devices("") == ""
