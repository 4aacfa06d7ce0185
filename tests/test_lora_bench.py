"""`kljax bench rl --lora`: both sides train LoRA adapters of the same rank on the same modules
(the same number of trained parameters), at tiny sizes."""

import importlib.util
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.rl import save_char_tokenizer  # noqa: E402
from kljax.cli import main  # noqa: E402
from kljax.models.tiny import save_tiny_hf_model  # noqa: E402

HAS_PEER = all(importlib.util.find_spec(m) is not None for m in ("trl", "peft"))


def test_bench_rl_lora_trains_the_same_adapters_on_both_sides(tmp_path):
    model = save_tiny_hf_model("llama_tied", tmp_path / "tiny")
    save_char_tokenizer(model)
    out = tmp_path / "rl.json"
    flags = ["--prompts", "2", "--group", "2", "--new-tokens", "4", "--repeats", "1", "--warmup", "0",
             "--lora", "4", "--lora-targets", "q,v,down"]
    assert main(["bench", "rl", "--model", str(model), *flags, "--json", str(out)]
                + ([] if HAS_PEER else ["--no-peer"])) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["lora_rank"] == 4 and result["settings"]["lora_targets"] == ["q", "v", "down"]
    k = result["sides"]["kljax"]
    cfg = json.loads((model / "config.json").read_text())
    d, f, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    q_out = cfg["num_attention_heads"] * (cfg.get("head_dim") or d // cfg["num_attention_heads"])
    v_out = cfg["num_key_value_heads"] * (cfg.get("head_dim") or d // cfg["num_attention_heads"])
    assert k["trained_params"] == n * 4 * ((d + q_out) + (d + v_out) + (f + d))
    if HAS_PEER:
        assert result["sides"]["peer"]["trained_params"] == k["trained_params"]
    # MFU counts a LoRA update as forward + backward through activations only: 4 (not 6) FLOPs a weight a token
    tokens = k["tokens_per_iteration"]
    expected = 4 * (k["non_embedding_params"] * tokens["sequence"] + k["head_params"] * tokens["generated"])
    assert abs(k["model_flops"]["update"] - expected) <= 1e-9 * expected


def test_bench_rl_rejects_bad_lora_targets(tmp_path, cli_user_error):
    cli_user_error(["bench", "rl", "--no-peer", "--lora", "4", "--lora-targets", "q,x"], "model.lora.targets")
