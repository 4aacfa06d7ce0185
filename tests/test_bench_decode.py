"""`kljax bench decode` end to end on a tiny random model with tiny sizes."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kljax.cli import main  # noqa: E402
from kljax.models.tiny import save_tiny_hf_model  # noqa: E402


def test_bench_decode_writes_speeds_and_ratio(tmp_path, capsys):
    model = save_tiny_hf_model("llama_tied", tmp_path / "tiny")
    out = tmp_path / "bench.json"
    code = main([
        "bench", "decode", "--model", str(model), "--batch", "2", "--prompt-len", "5", "--new-tokens", "4",
        "--repeats", "2", "--warmup", "0", "--peer-threads", "1", "--json", str(out),
    ])
    assert code == 0
    result = json.loads(out.read_text())
    assert {"kljax", "peer", "ratio", "modes", "settings", "machine"} <= set(result)
    assert result["kljax"] > 0 and result["peer"] > 0
    assert result["ratio"] == pytest.approx(result["kljax"] / result["peer"])
    for mode in ("greedy", "sampled"):
        row = result["modes"][mode]
        assert len(row["kljax"]["seconds"]) == 2 and len(row["peer"]["seconds"]) == 2
        assert row["kljax"]["min"] <= row["kljax"]["tokens_per_s"] <= row["kljax"]["max"]
        assert row["kljax_compile_s"] > 0
    assert result["settings"]["batch"] == 2 and result["settings"]["new_tokens"] == 4
    printed = capsys.readouterr().out
    assert "greedy" in printed and "transformers" in printed and "ratio" in printed


def test_bench_decode_rejects_bad_modes(tmp_path):
    with pytest.raises(ValueError, match="--modes"):
        main(["bench", "decode", "--model", str(tmp_path), "--modes", "beam"])
