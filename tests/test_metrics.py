"""metrics.jsonl survives a kill mid-append, and resumed runs drop rows past the checkpoint."""

from __future__ import annotations

import pytest

from kljax.train.metrics import MetricsWriter, deterministic, read_jsonl


def test_partial_last_line_is_dropped_and_bad_lines_are_errors(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')
    assert read_jsonl(path) == [{"step": 1, "reward": 0.5}]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_jsonl(path)


def test_truncate_after_keeps_rows_up_to_the_step(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        writer.write(step, {"reward": float(step), "time_step": 0.1, "host_memory_mb": 100.0})
    (tmp_path / "metrics.jsonl").open("a").write('{"step": 4, "rew')  # killed mid-append
    writer.truncate_after(2)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert deterministic(rows[0]) == {"step": 1, "reward": 1.0}
    writer.truncate_after(0)
    assert read_jsonl(tmp_path / "metrics.jsonl") == []
