"""Per-step metrics of a run: JSON lines (`metrics.jsonl`, the record) and the trackers of
config.logging.report_to (`kljax.train.tracking`: TensorBoard, W&B, MLflow).

Only process 0 writes. On resume, lines after the restored step are dropped first, so a resumed
run's metrics file is the same as an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kljax.config.run import RunConfig
from kljax.train import tracking

# Metrics that measure the machine, not the run: they differ between identical runs.
VOLATILE_PREFIXES = ("time_", "tokens_per_s", "host_memory_mb")


def deterministic(row: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics row without its machine-dependent entries (timings, throughput, memory)."""
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE_PREFIXES)}


def to_python(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Device scalars -> plain floats (nan/inf kept as floats)."""
    return {k: float(np.asarray(v)) for k, v in metrics.items()}


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file (empty list when it does not exist).

    A last line cut short (the process was killed while appending it) is dropped; a malformed
    line anywhere else is an error naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = [line.strip() for line in path.read_text().splitlines()]
    rows = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON: {e}") from None
    return rows


class MetricsWriter:
    """Append one row per step to WORKDIR/metrics.jsonl and report it to the trackers: those of
    `config.logging.report_to` when a run config is given (`tracking.open_trackers`; `resume`
    reopens the tracked runs), else TensorBoard events in WORKDIR/tb when `tensorboard`."""

    def __init__(self, workdir: str | os.PathLike, tensorboard: bool = True, config: RunConfig | None = None,
                 resume: bool = False) -> None:
        self.active = jax.process_index() == 0
        self.path = Path(workdir) / "metrics.jsonl"
        self._trackers: list[tracking.Tracker] = []
        if self.active and config is not None:
            self._trackers = tracking.open_trackers(config, workdir, resume)
        elif self.active and tensorboard and tracking._installed("tensorboardX"):
            self._trackers = [tracking.TensorBoardTracker(Path(workdir))]

    def truncate_after(self, step: int) -> None:
        """Drop rows with step > `step` (left by a run that died after its last checkpoint)."""
        if not self.active or not self.path.exists():
            return
        rows = [r for r in read_jsonl(self.path) if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(self.path)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.active:
            return
        row = {"step": int(step), **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}  # JSON null
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for tracker in self._trackers:
            tracker.log(int(step), metrics)

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []
