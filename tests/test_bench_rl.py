"""`kljax bench rl` end to end on a tiny random model (with a character tokenizer) at tiny sizes."""

import importlib.util
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.rl import save_char_tokenizer  # noqa: E402
from kljax.cli import main  # noqa: E402
from kljax.models.tiny import save_tiny_hf_model  # noqa: E402

HAS_TRL = importlib.util.find_spec("trl") is not None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    model = save_tiny_hf_model("llama_tied", tmp_path_factory.mktemp("rl") / "tiny")
    save_char_tokenizer(model)
    return model


def test_bench_rl_times_both_sides_on_the_same_work(tiny_model, tmp_path, capsys):
    out = tmp_path / "rl.json"
    flags = ["--prompts", "2", "--group", "2", "--new-tokens", "6", "--repeats", "2", "--warmup", "0",
             "--micro-batches", "2"]  # each side splits its one update per iteration into 2 micro-batches
    code = main(["bench", "rl", "--model", str(tiny_model), *flags, "--json", str(out)]
                + ([] if HAS_TRL else ["--no-peer"]))
    assert code == 0
    result = json.loads(out.read_text())
    assert {"kljax", "mfu", "sides", "settings", "machine", "versions"} <= set(result)
    k = result["sides"]["kljax"]
    assert result["mfu"] > 0 and result["kljax"] > 0 and k["compile_s"] > 0
    assert len(k["iterations_per_s"]["seconds"]) == 2 and k["min"] <= k["median"] <= k["max"]
    assert set(k["split"]) == {"sample", "reward", "score", "update"}
    assert k["iterations"] == 3 and k["optimizer_steps"] == 3 and k["completions_per_iteration"] == 4
    assert 0 < k["tokens_per_iteration"]["generated"] <= 4 * 6
    assert k["peak_rss_mb"] > 0 and result["settings"]["new_tokens"] == 6 and result["settings"]["micro_batches"] == 2
    captured = capsys.readouterr()
    printed = captured.out
    assert "kljax" in printed and "s/iter" in printed
    for i in (1, 2, 3):  # progress, one line per side and iteration, as it happens
        assert f"kljax bench rl [kljax]: iteration {i}/3 in " in captured.err
        assert f"kljax bench rl [peer]: iteration {i}/3 in " in captured.err or not HAS_TRL
    if not HAS_TRL:
        pytest.skip("trl is not installed (the `bench` extra): the peer side was not run")
    p = result["sides"]["peer"]
    assert {"peer", "ratio"} <= set(result)
    assert result["ratio"] == pytest.approx(result["peer"] / result["kljax"])  # kljax speed / TRL speed
    for key in ("iterations", "optimizer_steps", "completions_per_iteration", "non_embedding_params", "head_params"):
        assert p[key] == k[key], key
    assert p["prompt_tokens_match_kljax"] and p["prompt_format"] == k["prompt_format"] == "raw"
    assert p["tokens_per_iteration"]["prompt_unique"] == k["tokens_per_iteration"]["prompt_unique"]
    assert p["mfu"] > 0 and p["peak_rss_mb"] > 0
    assert "TRL GRPO" in printed and "ratio" in printed


def test_bench_rl_bfloat16_runs_both_sides_in_bfloat16_compute(tiny_model, tmp_path):
    """--dtype bfloat16: kljax's model computes in bfloat16 over float32 weights (layers unrolled with
    --no-scan), TRL runs under accelerate's bf16 autocast; the MFU peak is a bfloat16 matmul's."""
    out = tmp_path / "rl.json"
    flags = ["--prompts", "2", "--group", "2", "--new-tokens", "4", "--repeats", "1", "--warmup", "0",
             "--dtype", "bfloat16", "--no-scan", "--force-peer"]  # a tiny model: fast even without native bf16
    assert main(["bench", "rl", "--model", str(tiny_model), *flags, "--json", str(out)]
                + ([] if HAS_TRL else ["--no-peer"])) == 0
    result = json.loads(out.read_text())
    k = result["sides"]["kljax"]
    assert result["settings"]["dtype"] == "bfloat16" and result["settings"]["scan_layers"] is False
    assert (k["compute_dtype"], k["param_dtype"], k["scan_layers"]) == ("bfloat16", "float32", False)
    assert k["peak"]["dtype"] == "bfloat16" and result["mfu"] > 0
    if not HAS_TRL:
        pytest.skip("trl is not installed (the `bench` extra): the peer side was not run")
    assert result["sides"]["peer"]["mixed_precision"] == "bf16"


def test_bench_rl_skips_trl_in_bfloat16_where_torch_has_no_fast_bfloat16(tiny_model, tmp_path, monkeypatch, capsys):
    """Where torch's bfloat16 GEMM is far below its float32 one (a CPU without native bfloat16), TRL's
    bf16 side would take hours: the benchmark reports kljax's side and says why TRL's was skipped."""
    from benchmarks import common

    monkeypatch.setattr(common, "torch_matmul_gflops", lambda dtype, threads: {"float32": 52.5, "bfloat16": 0.9}[dtype])
    out = tmp_path / "rl.json"
    flags = ["--prompts", "2", "--group", "2", "--new-tokens", "4", "--repeats", "1", "--warmup", "0",
             "--dtype", "bfloat16"]
    assert main(["bench", "rl", "--model", str(tiny_model), *flags, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["sides"]) == {"kljax"} and "ratio" not in result
    assert "0.9 GFLOP/s" in result["peer_skipped"] and "about 58x slower" in result["peer_skipped"]
    assert "TRL side skipped" in capsys.readouterr().out
    from benchmarks.rl import slow_peer_reason

    assert slow_peer_reason({"dtype": "float32", "threads": 1}) is None


@pytest.mark.parametrize("flag, value", [("--prompts", "0"), ("--group", "1"), ("--repeats", "0"),
                                         ("--warmup", "-1"), ("--threads", "0"), ("--threads", "100000"),
                                         ("--micro-batches", "0"), ("--micro-batches", "3")])
def test_bench_rl_rejects_bad_values(tiny_model, flag, value, cli_user_error):
    cli_user_error(["bench", "rl", "--model", str(tiny_model), flag, value], f"{flag}.*{value}")


def test_bench_rl_rejects_a_directory_without_a_checkpoint(tmp_path, cli_user_error):
    cli_user_error(["bench", "rl", "--model", str(tmp_path)], "no config.json")
