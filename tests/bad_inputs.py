"""Generated bad inputs for the CLI error tests: broken model directories, config files, data.

`make_inputs(root)` writes them under `root` and returns name -> path. A good tiny HF checkpoint
("good": config.json + model.safetensors, random float32 weights, no tokenizer; "good_tok" with a
word-level tokenizer) is the base every broken model directory is made from, one defect each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

TINY_HF = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    tie_word_embeddings=True, rms_norm_eps=1e-6,
)


def _tensors() -> dict[str, np.ndarray]:
    from kljax.models.config import ModelConfig
    from kljax.models.convert import _hf_keys, _rules_for, hf_shape

    config = ModelConfig.from_hf(TINY_HF)
    rng = np.random.default_rng(0)
    return {key: rng.normal(0, 0.1, hf_shape(rule, shape)).astype(np.float32)
            for rule, shape in _rules_for(config) for key in _hf_keys(rule, config)}


def _model(root: Path, name: str, tensors: dict[str, np.ndarray] | None = None, config: object = TINY_HF,
           file: str = "model.safetensors") -> Path:
    from safetensors.numpy import save_file

    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(d / file))
    return d


def _tokenizer(d: Path) -> None:
    """A word-level tokenizer.json of the tiny vocabulary (t0 ... t29, <unk>, </s>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(30)} | {"<unk>": 30, "</s>": 31}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))


def make_inputs(root: Path) -> dict[str, Path]:
    """Write every bad input under `root`; name -> path."""
    t = _tensors()
    good = _model(root, "good", t)
    p: dict[str, Path] = {"good": good}
    weights = (good / "model.safetensors").read_bytes()
    p["missing_dir"] = root / "no_such_dir"
    (root / "empty_dir").mkdir()
    p["empty_dir"] = root / "empty_dir"
    p["bad_json"] = _model(root, "bad_json", t, '{"architectures": ["LlamaForCausalLM"],')
    p["list_json"] = _model(root, "list_json", t, "[1, 2, 3]")
    p["binary_json"] = _model(root, "binary_json", t, "\x00\xff garbage")
    p["unknown_arch"] = _model(root, "unknown_arch", t, {**TINY_HF, "architectures": ["GPT2LMHeadModel"]})
    p["no_hidden"] = _model(root, "no_hidden", t, {k: v for k, v in TINY_HF.items() if k != "hidden_size"})
    p["str_hidden"] = _model(root, "str_hidden", t, {**TINY_HF, "hidden_size": "sixteen"})
    p["no_weights"] = _model(root, "no_weights")
    p["backup_only"] = _model(root, "backup_only", t, file="backup.safetensors")
    p["missing_tensor"] = _model(root, "missing_tensor", {k: v for k, v in t.items() if k != "model.norm.weight"})
    p["bad_shape"] = _model(root, "bad_shape", {**t, "model.norm.weight": np.ones(17, np.float32)})
    p["extra_tensor"] = _model(root, "extra_tensor", {**t, "model.extra.weight": np.ones(3, np.float32)})
    nan = dict(t)
    nan["model.layers.1.mlp.up_proj.weight"] = np.full_like(t["model.layers.1.mlp.up_proj.weight"], np.nan)
    p["nan_weights"] = _model(root, "nan_weights", nan)
    inf = dict(t)
    inf["model.embed_tokens.weight"] = t["model.embed_tokens.weight"].copy()
    inf["model.embed_tokens.weight"][3, 4] = np.inf
    p["inf_weights"] = _model(root, "inf_weights", inf)
    _tokenizer(p["nan_weights"])
    _tokenizer(p["inf_weights"])
    p["good_tok"] = root / "good_tok"
    shutil.copytree(good, p["good_tok"])
    _tokenizer(p["good_tok"])
    for name, data in (("empty_st", b""), ("short_st", weights[:5]), ("truncated_st", weights[: len(weights) // 2]),
                       ("garbage_st", np.random.default_rng(1).bytes(4096)),
                       ("bad_header_st", (20).to_bytes(8, "little") + b"{not json at all!!!" + b"\x00" * 64)):
        d = _model(root, name)
        (d / "model.safetensors").write_bytes(data)
        p[name] = d
    d = _model(root, "index_missing_shard")
    index = {"weight_map": {"model.norm.weight": "part-1.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    p["index_missing_shard"] = d
    d = _model(root, "index_bad_json")
    (d / "model.safetensors.index.json").write_text("{weight_map")
    p["index_bad_json"] = d
    from safetensors.numpy import save_file

    d = _model(root, "duplicate_tensor")
    save_file(t, str(d / "a.safetensors"))
    save_file({"model.norm.weight": t["model.norm.weight"]}, str(d / "b.safetensors"))
    weight_map = {**dict.fromkeys(t, "a.safetensors")}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map | {"x": "b.safetensors"}}))
    p["duplicate_tensor"] = d
    d = root / "bad_tokenizer"
    shutil.copytree(good, d)
    (d / "tokenizer.json").write_text("{ this is not a tokenizer")
    p["bad_tokenizer"] = d
    # files
    (root / "a_file").write_text("just a file\n")
    p["a_file"] = root / "a_file"
    (root / "syntax.py").write_text("def get_config(:\n    pass\n")
    p["syntax_config"] = root / "syntax.py"
    (root / "no_get.py").write_text("x = 1\n")
    p["no_get_config"] = root / "no_get.py"
    (root / "raises.py").write_text("def get_config():\n    return 1 / 0\n")
    p["raising_config"] = root / "raises.py"
    return p
