"""Multi-host training on JAX's multi-controller runtime, with 2 local CPU processes over gloo.

Each worker (`tests/_multihost_worker.py`) is a separate Python process with its own simulated CPU
device count. The 2-process run (1 device each, mesh fsdp=2) must end with exactly the parameters of
one process with 2 devices and the same mesh; its checkpoint must resume in one process on one
device (resharded on restore) and continue exactly as the 1-process run's checkpoint does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kljax.config import RLConfig
from kljax.parallel import distributed
from kljax.train.metrics import deterministic, read_jsonl

WORKER = Path(__file__).with_name("_multihost_worker.py")
TIMEOUT_S = 240  # per group of workers; a hung collective fails the test instead of blocking it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_workers(commands: list[list[str]], logs: Path, timeout: float = TIMEOUT_S) -> None:
    """Start the worker commands together; fail with their output if one fails or they hang."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONUNBUFFERED"] = "1"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, cmd in enumerate(commands):
        out = open(logs / f"worker{i}.log", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen([sys.executable, str(WORKER), *cmd], stdout=out, stderr=subprocess.STDOUT,
                                       env=env, cwd=WORKER.parents[1]), out))
    deadline = time.monotonic() + timeout
    failed = None
    try:
        while any(p.poll() is None for p, _ in procs):
            if any(p.returncode not in (None, 0) for p, _ in procs):
                failed = "a worker failed"
                break
            if time.monotonic() > deadline:
                failed = f"worker(s) still running after {timeout:.0f}s (hung?)"
                break
            time.sleep(0.2)
        if failed is None and any(p.returncode != 0 for p, _ in procs):
            failed = "a worker failed"
    finally:
        for p, out in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
    if failed:
        report = []
        for i, (p, _) in enumerate(procs):
            text = (logs / f"worker{i}.log").read_text()
            report.append(f"--- worker {i} {commands[i]} rc={p.returncode}\n{text[-3000:]}")
        pytest.fail(f"{failed}\n" + "\n".join(report))


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def stable(rows):
    return [deterministic(r) for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Steps 1-3 of a 5-step run: 2 processes x 1 device, and 1 process x 2 devices (mesh fsdp=2)."""
    root = tmp_path_factory.mktemp("multihost")
    port = free_port()
    common = ["--steps", "5", "--stop-after", "3", "--fsdp", "2"]
    multi = [["--devices", "1", "--coordinator", f"localhost:{port}", "--num-processes", "2",
              "--process-id", str(i), "--workdir", str(root / "multi"), *common]
             + (["--dump", str(root / "multi.npz")] if i == 0 else []) for i in range(2)]
    single = ["--devices", "2", "--workdir", str(root / "single"), "--no-eval", *common,
              "--dump", str(root / "single.npz")]
    t0 = time.perf_counter()
    run_workers([*multi, single], root / "logs_first")
    print(f"2-process + 1-process runs: {time.perf_counter() - t0:.0f}s")
    return root


def test_two_processes_equal_one_process_with_two_devices(runs):
    multi, single = load(runs / "multi.npz"), load(runs / "single.npz")
    assert multi.keys() == single.keys() and len(multi) > 5
    for key in multi:
        np.testing.assert_allclose(multi[key], single[key], rtol=0, atol=1e-6, err_msg=key)
    rows = read_jsonl(runs / "multi" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]  # process 0 alone writes metrics
    a, b = stable(rows), stable(read_jsonl(runs / "single" / "metrics.jsonl"))
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        np.testing.assert_allclose([ra[k] for k in ra], [rb[k] for k in ra], rtol=1e-5, atol=1e-6)
    assert (runs / "multi" / "eval_before.json").exists()  # greedy eval gathered across processes
    assert sorted(p.name for p in (runs / "multi" / "checkpoints").iterdir() if p.name.isdigit()) == ["3"]


def test_two_process_checkpoint_resumes_in_one_process(runs):
    """Resume both step-3 checkpoints on ONE device (fsdp=2 -> 1, resharded by orbax) to step 5."""
    resume = ["--devices", "1", "--fsdp", "1", "--steps", "5", "--resume", "--no-eval"]
    run_workers([[*resume, "--workdir", str(runs / "multi"), "--dump", str(runs / "multi5.npz")],
                 [*resume, "--workdir", str(runs / "single"), "--dump", str(runs / "single5.npz")]],
                runs / "logs_resume")
    rows = read_jsonl(runs / "multi" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    resumed, reference = load(runs / "multi5.npz"), load(runs / "single5.npz")
    step3 = load(runs / "multi.npz")
    for key in resumed:
        np.testing.assert_allclose(resumed[key], reference[key], rtol=0, atol=1e-6, err_msg=key)
    assert any(np.abs(resumed[k] - step3[k]).max() > 1e-6 for k in resumed)  # it did train on


# ---------------------------------------------------------------------------------------- options, meshes


def test_options_from_flags_and_env():
    env = {"KLJAX_COORDINATOR": "10.0.0.1:8476", "KLJAX_NUM_PROCESSES": "4", "KLJAX_PROCESS_ID": "3"}
    opts = distributed.options_from(env=env)
    assert (opts.coordinator, opts.num_processes, opts.process_id) == ("10.0.0.1:8476", 4, 3)
    opts = distributed.options_from("h:1", 2, 0, env=env)  # flags win
    assert (opts.coordinator, opts.num_processes, opts.process_id) == ("h:1", 2, 0)
    assert not distributed.options_from(env={}).explicit
    with pytest.raises(ValueError, match="missing"):
        distributed.options_from("h:1", env={})
    with pytest.raises(ValueError, match="HOST:PORT"):
        distributed.options_from("nohost", 2, 0, env={})
    with pytest.raises(ValueError, match="process-id=2"):
        distributed.options_from("h:1", 2, 2, env={})


def test_detected_cluster():
    assert distributed.detected_cluster({}) is None
    assert distributed.detected_cluster({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}) is None
    assert distributed.detected_cluster({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}) == "slurm"
    assert distributed.detected_cluster({"TPU_WORKER_HOSTNAMES": "a,b"}) == "tpu"
    assert distributed.detected_cluster({"OMPI_COMM_WORLD_SIZE": "2"}) == "openmpi"


class _Heads:
    num_heads, num_kv_heads = 28, 4


def test_check_mesh_says_what_fits():
    rl = RLConfig(group_size=4, prompts_per_step=8)
    assert distributed.check_mesh((1, -1, 1), 8, rl) == (1, 8, 1)
    assert distributed.check_mesh((1, 4, 2), 8, rl) == (1, 4, 2)
    with pytest.raises(ValueError, match=r"needs 6 devices but 8.*shapes that fit: data=1,fsdp=8,tensor=1"):
        distributed.check_mesh((1, 3, 2), 8, rl)
    with pytest.raises(ValueError, match=r"prompts_per_step=8 does not split over data\*fsdp=16"):
        distributed.check_mesh((1, 16, 1), 16, rl)
    with pytest.raises(ValueError, match=r"tensor=8 does not divide the model's 28 attention heads.*fsdp=2,tensor=4"):
        distributed.check_mesh((1, 1, 8), 8, rl, _Heads())
    with pytest.warns(UserWarning, match="KV heads"):
        distributed.check_mesh((1, 1, 7), 7, RLConfig(group_size=7, prompts_per_step=7), _Heads())
    assert distributed.parse_mesh("fsdp=64") == (1, 64, 1)
    assert distributed.parse_mesh("data=2, fsdp=-1,tensor=4") == (2, -1, 4)
    with pytest.raises(ValueError, match="data=N"):
        distributed.parse_mesh("model=4")


# ---------------------------------------------------------------------------------------- launch scripts


def _bash(*args: str) -> subprocess.CompletedProcess:
    repo = WORKER.parents[1]
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no gcloud: a dry run must not call it
    return subprocess.run(["bash", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60)


def test_launch_scripts_help_and_tpu_dry_run():
    for script in ("launch/tpu_pod.sh", "launch/gpu_host.sh"):
        done = _bash(script, "--help")
        assert done.returncode == 0 and done.stdout.startswith("Usage:"), (script, done.stderr)
    done = _bash("launch/tpu_pod.sh", "--dry-run", "--name", "kl-7b", "--zone", "us-west4-a", "--accelerator-type",
                 "v5litepod-64", "--spot", "--bucket", "my-bucket", "--", "kljax", "train", "--config",
                 "configs/paper_qwen25_7b_math.py", "--workdir", "/mnt/kljax/runs/a", "--resume")
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("gcloud ")]
    assert lines[0] == ("gcloud compute tpus tpu-vm create kl-7b --zone=us-west4-a --accelerator-type=v5litepod-64 "
                        "--version=tpu-ubuntu2204-base --spot")
    assert lines[1].startswith("gcloud compute tpus tpu-vm scp ") and lines[1].endswith("--worker=all")
    ssh = [ln for ln in lines if ln.startswith("gcloud compute tpus tpu-vm ssh kl-7b --zone=us-west4-a --worker=all")]
    assert len(ssh) == 3  # install, mount the bucket, run
    assert "bash launch/setup.sh" in ssh[0] and "jax[tpu]" in ssh[0]
    assert "gcsfuse --implicit-dirs my-bucket /mnt/kljax" in ssh[1]
    assert ssh[2].endswith("kljax train --config configs/paper_qwen25_7b_math.py --workdir /mnt/kljax/runs/a "
                           "--resume '")
    assert _bash("launch/tpu_pod.sh", "--dry-run", "--name", "x", "--zone", "y").returncode == 2  # no command
    done = _bash("launch/gpu_host.sh", "--dry-run", "--gpus", "0,1", "--", "kljax", "train", "--workdir", "w")
    assert done.returncode == 0 and "CUDA_VISIBLE_DEVICES=0,1" in done.stdout
    assert done.stdout.rstrip().endswith("kljax train --workdir w")


def test_train_cli_takes_multihost_flags():
    from kljax.cli import build_parser

    args, _ = build_parser().parse_known_args(["train", "--workdir", "w", "--coordinator", "10.0.0.2:8476",
                                               "--num-processes", "4", "--process-id", "1"])
    assert (args.coordinator, args.num_processes, args.process_id) == ("10.0.0.2:8476", 4, 1)
