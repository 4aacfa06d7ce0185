"""`kljax bench kl` at tiny shapes: JSON layout, ratio, memory analysis, and kljax == PyTorch per case."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from benchmarks import kl_cases  # noqa: E402
from benchmarks.kl import CASES  # noqa: E402
from kljax.cli import main  # noqa: E402

TINY = ["--batch", "3", "--seq-len", "16", "--iters", "2", "--full-batch", "2", "--full-len", "8", "--full-chunk", "3",
        "--hidden", "16", "--vocab", "50", "--memory-batch", "2", "--memory-len", "64"]


def test_bench_kl_writes_speeds_ratio_and_memory(tmp_path, capsys):
    out = tmp_path / "kl.json"
    code = main(["bench", "kl", *TINY, "--repeats", "2", "--warmup", "0", "--peer-threads", "1", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert {"kljax", "peer", "ratio", "cases", "settings", "machine", "versions"} <= set(result)
    assert result["mfu"] is None
    assert result["ratio"] == pytest.approx(result["kljax"] / result["peer"])
    assert set(result["cases"]) == {"k1", "k2", "k3", "kl_terms", "kl_surrogate", "full_kl_chunked", "full_kl_naive"}
    for name, row in result["cases"].items():
        assert len(row["kljax"]["seconds"]) == 2 and len(row["peer"]["seconds"]) == 2, name
        assert row["ratio"] == pytest.approx(row["kljax"]["tokens_per_s"] / row["peer"]["tokens_per_s"])
        assert row["check"]["ok"], (name, row["check"])
    assert result["cases"]["k3"]["shape"] == [3, 16] and result["cases"]["full_kl_naive"]["shape"] == [2, 8]
    chunked, naive = result["cases"]["full_kl_chunked"], result["cases"]["full_kl_naive"]
    # At 2 x 64 positions the naive version holds [2, 64, V] logits; chunks of 3 positions hold far less.
    assert chunked["memory_at"]["shape"] == [2, 64]
    assert chunked["memory_at"]["temp_bytes"] < naive["memory_at"]["temp_bytes"]
    printed = capsys.readouterr().out
    assert "full_kl_chunked" in printed and "PyTorch" in printed and "ratio" in printed


@pytest.mark.parametrize("case", CASES)
def test_kl_cases_agree_with_pytorch(case):
    import jax

    rng = np.random.default_rng(0)
    if case.startswith("full"):
        inputs = kl_cases.full_inputs(rng, 2, 7, 12, 40, "float32")
    else:
        inputs = kl_cases.token_inputs(rng, 4, 9)
    ours = jax.jit(kl_cases.jax_case(case, 3, "float32"))(*inputs)
    fn, tensors = kl_cases.torch_case(case, inputs, 3, "cpu")
    check = kl_cases.compare(ours, fn(*tensors), "float32")
    assert check["value_rel_diff"] < 1e-4 and check["grad_rel_diff"] < 1e-4, check


@pytest.mark.parametrize("argv, message", [
    (["--cases", "k4"], "--cases must be a comma-separated subset"),
    (["--full-chunk", "0"], "--full-chunk must be >= 1, got 0"),
    (["--memory-len", "-1"], "--memory-len must be >= 0, got -1"),
])
def test_bench_kl_rejects_bad_arguments(argv, message, cli_user_error):
    cli_user_error(["bench", "kl", "--no-peer", *argv], message)
