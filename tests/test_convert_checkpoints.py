"""Checkpoint loading: sharded and bf16 files, and clear errors for bad checkpoints."""

import json
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kljax.models.convert import (  # noqa: E402
    check_vocab,
    export_hf,
    load_hf_checkpoint,
    read_hf_config,
)
from kljax.models.tiny import save_tiny_hf_model, tiny_hf_model  # noqa: E402

Q_KEY = "model.layers.1.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_tiny_hf_model("qwen3", tmp_path_factory.mktemp("qwen3"))


def edited_copy(src, dst, edit):
    """Copy a checkpoint dir, applying edit(tensors dict) to its single safetensors file."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_missing_tensor_is_named(qwen3_dir, tmp_path):
    bad = edited_copy(qwen3_dir, tmp_path / "bad", lambda t: t.pop(Q_KEY))
    with pytest.raises(ValueError, match=r"missing 1 tensor.*model\.layers\.1\.self_attn\.q_proj\.weight"):
        load_hf_checkpoint(bad)


def test_unexpected_tensor_is_named(qwen3_dir, tmp_path):
    def add(t):
        t["model.layers.0.self_attn.extra.weight"] = np.zeros((2, 2), np.float32)

    bad = edited_copy(qwen3_dir, tmp_path / "bad", add)
    with pytest.raises(ValueError, match=r"unexpected tensor.*model\.layers\.0\.self_attn\.extra\.weight"):
        load_hf_checkpoint(bad)


def test_layer_beyond_config_is_unexpected(qwen3_dir, tmp_path):
    def add(t):
        t["model.layers.2.input_layernorm.weight"] = np.ones((32,), np.float32)

    bad = edited_copy(qwen3_dir, tmp_path / "bad", add)
    with pytest.raises(ValueError, match=r"model\.layers\.2\.input_layernorm\.weight"):
        load_hf_checkpoint(bad)


def test_wrong_shape_names_key_expected_and_found(qwen3_dir, tmp_path):
    def reshape(t):
        t[Q_KEY] = np.zeros((64, 31), np.float32)

    bad = edited_copy(qwen3_dir, tmp_path / "bad", reshape)
    with pytest.raises(ValueError, match=r"q_proj\.weight: expected shape \(64, 32\).*found \(64, 31\)"):
        load_hf_checkpoint(bad)


def test_pickle_only_directory_is_refused(qwen3_dir, tmp_path):
    bad = tmp_path / "bin"
    bad.mkdir()
    shutil.copy(qwen3_dir / "config.json", bad / "config.json")
    (bad / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match=r"only pickle weights \(pytorch_model\.bin\).*safetensors"):
        load_hf_checkpoint(bad)


def test_unsupported_architecture_lists_supported(qwen3_dir, tmp_path):
    bad = tmp_path / "mistral"
    shutil.copytree(qwen3_dir, bad)
    config = read_hf_config(bad)
    config.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (bad / "config.json").write_text(json.dumps(config))
    names = r"MistralForCausalLM.*LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM"
    with pytest.raises(ValueError, match=names):
        load_hf_checkpoint(bad)


def test_vocab_mismatch_with_tokenizer(qwen3_dir):
    _, config = load_hf_checkpoint(qwen3_dir)
    check_vocab(config, config.vocab_size)  # equal: fine
    check_vocab(config, config.vocab_size - 5)  # padded embedding: fine
    with pytest.raises(ValueError, match=r"tokenizer has 97 tokens.*vocab_size=96"):
        check_vocab(config, config.vocab_size + 1)


def test_sharded_and_bf16_checkpoints_load(qwen3_dir, tmp_path):
    params, _ = load_hf_checkpoint(qwen3_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    sharded, _ = load_hf_checkpoint(tmp_path / "sharded")
    assert_trees_equal(sharded, params)

    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    bf16, config = load_hf_checkpoint(tmp_path / "bf16")  # read as bf16, stored as float32 params
    want = jax.tree.map(lambda x: np.asarray(x.astype("bfloat16").astype("float32")), params)
    assert_trees_equal(bf16, want)
    bf16_params, cfg = load_hf_checkpoint(tmp_path / "bf16", param_dtype="bfloat16")
    assert {x.dtype.name for x in jax.tree.leaves(bf16_params)} == {"bfloat16"}


def test_sharded_bf16_export_loads_in_transformers(qwen3_dir, tmp_path):
    params, config = load_hf_checkpoint(qwen3_dir)
    out = export_hf(params, config, tmp_path / "out", dtype="bfloat16", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    again, _ = load_hf_checkpoint(out)
    want = jax.tree.map(lambda x: np.asarray(x.astype("bfloat16").astype("float32")), params)
    assert_trees_equal(again, want)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    ref = tiny_hf_model("qwen3").to(torch.bfloat16).state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, ref[key]), key
    with pytest.raises(ValueError, match="not empty"):
        export_hf(params, config, out)
