"""Per-step metrics of a run: JSON lines (`metrics.jsonl`) and TensorBoard event files.

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


def to_python(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Device scalars -> plain floats (nan/inf kept as floats)."""
    return {k: float(np.asarray(v)) for k, v in metrics.items()}


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file (empty list when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with path.open() as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


class MetricsWriter:
    """Append one row per step to WORKDIR/metrics.jsonl and to TensorBoard events in WORKDIR/tb."""

    def __init__(self, workdir: str | os.PathLike, tensorboard: bool = True) -> None:
        self.active = jax.process_index() == 0
        self.path = Path(workdir) / "metrics.jsonl"
        self._tb = None
        if self.active and tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:  # optional: JSONL is the record, TensorBoard a view of it
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(str(Path(workdir) / "tb"))

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
        row = {"step": int(step), **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
