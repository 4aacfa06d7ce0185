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
    # MFU: the same nominal FLOPs and peak for both sides, so MFUs stand in the ratio of the speeds
    assert result["peak_gflops"] > 0 and result["model_flops_per_generate"] > 0
    assert result["mfu"] / result["peer_mfu"] == pytest.approx(result["ratio"])
    tokens = 2 * 4
    for row in result["modes"].values():
        assert row["kljax_mfu"] == pytest.approx(
            result["model_flops_per_generate"] * row["kljax"]["tokens_per_s"] / tokens / (result["peak_gflops"] * 1e9))
        assert row["kljax_mfu"] / row["peer_mfu"] == pytest.approx(row["ratio"])
    floor = result["floor"]
    assert floor["prefill_s"] > 0 and floor["decode_matmul_s"] > 0
    assert floor["tokens_per_s"] == pytest.approx(tokens / (floor["prefill_s"] + floor["decode_matmul_s"]))
    printed = capsys.readouterr().out
    assert "greedy" in printed and "transformers" in printed and "ratio" in printed and "MFU" in printed
    assert "matmul floor" in printed


def test_sample_flops_counts_prefill_once_and_the_head_per_generated_token():
    from benchmarks import common

    n_body, n_head = common.body_and_head_params(1000, vocab_size=10, hidden_size=5, tied=True)
    assert (n_body, n_head) == (950, 50)
    assert common.body_and_head_params(1050, vocab_size=10, hidden_size=5, tied=False) == (950, 50)
    # one more prompt token costs the body once; one more generated token the body and the head
    base = common.sample_flops(n_body, n_head, 10, 4)
    assert base == 2 * 950 * 14 + 2 * 50 * 4
    assert common.sample_flops(n_body, n_head, 11, 4) - base == 2 * n_body
    assert common.sample_flops(n_body, n_head, 10, 5) - base == 2 * (n_body + n_head)


def test_bench_decode_rejects_bad_modes(tmp_path, cli_user_error):
    cli_user_error(["bench", "decode", "--model", str(tmp_path), "--modes", "beam"], "--modes")
    cli_user_error(["bench", "decode", "--model", str(tmp_path), "--peak-gflops", "0"],
                   "--peak-gflops must be > 0, got 0")


def test_matmul_floor_times_every_weight_matmul_of_the_model():
    """The floors' per-layer shapes hold exactly the model's non-embedding matmul weights (the
    N of `common.train_flops`), for grouped-query attention with a head_dim of its own."""
    from benchmarks import common
    from kljax.models import known_configs
    from kljax.models.config import ModelConfig

    for hf in (known_configs.QWEN2_5_0_5B, dict(known_configs.LLAMA_3_1_8B, head_dim=96)):
        config = ModelConfig.from_hf(hf)
        per_layer = sum(o * i for o, i in common.layer_matmul_shapes(config))
        expected = common.train_flops(config, 1, 1, 1)["non_embedding_params"]
        assert config.num_layers * per_layer == expected
