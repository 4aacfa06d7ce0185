"""Long-run stability: no recompilation after warm-up, no host-memory growth over hundreds of steps."""

from __future__ import annotations

import jax
import numpy as np
from jax._src import dispatch

from kljax.config import load_run_config
from kljax.train.metrics import read_jsonl
from kljax.train.trainer import train

MESH = ["--config.mesh.fsdp=4", "--config.mesh.tensor=2", "--config.eval_examples=8"]


def count_lowerings(fn) -> int:
    """How many jitted computations are lowered (compiled or fetched from the cache) while fn runs."""
    events = []

    def listener(event: str, duration: float, **_) -> None:
        if event == dispatch.JAXPR_TO_MLIR_MODULE_EVENT:
            events.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return len(events)


def test_no_recompilation_after_warmup_and_no_memory_growth(tmp_path):
    def run(steps: int, name: str):
        config = load_run_config(("configs/tiny.py"),
                                 [*MESH, f"--config.steps={steps}", f"--config.checkpoint_every={steps}"])
        return lambda: train(config, tmp_path / name, progress=False)

    run(3, "warmup")()  # module-level jits (sampler, random ops) compile once per process
    short = count_lowerings(run(3, "short"))
    long = count_lowerings(run(300, "long"))
    assert long == short, f"{long - short} extra compilations over 297 more steps: something recompiles per step"

    rss = np.asarray([r["host_memory_mb"] for r in read_jsonl(tmp_path / "long" / "metrics.jsonl")])
    warm = np.median(rss[20:60])
    late = np.median(rss[-40:])
    assert late - warm < 200, f"host memory grew from {warm:.0f} MB to {late:.0f} MB over 240 steps"


def test_nonfinite_steps_are_skipped_then_the_run_stops(tmp_path, monkeypatch):
    """NaN rewards make every update non-finite: each is skipped (params unchanged), and after
    max_nonfinite_steps in a row the run stops with an error naming the last checkpoint."""
    import pytest

    from kljax.train import rollout as rollout_mod
    from kljax.train.trainer import NonFiniteError

    real = rollout_mod.score_batch

    def poisoned(task, examples, completions, **kw):
        rewards, correct = real(task, examples, completions, **kw)
        return rewards * np.nan, correct

    config = load_run_config(("configs/tiny.py"),
                             [*MESH, "--config.steps=20", "--config.checkpoint_every=1",
                              "--config.max_nonfinite_steps=3"])
    monkeypatch.setattr(rollout_mod, "score_batch", poisoned)
    with pytest.raises(NonFiniteError, match=r"3 steps in a row.*Last checkpoint: step 2"):
        train(config, tmp_path, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["nonfinite"] for r in rows] == [1.0, 1.0, 1.0]
