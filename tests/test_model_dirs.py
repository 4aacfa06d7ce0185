"""Model directories read as transformers reads them: model.safetensors (or its index) and no other
file, and config.json defaults per architecture."""

from __future__ import annotations

import numpy as np
import pytest
from bad_inputs import TINY_HF, make_inputs
from safetensors.numpy import load_file, save_file

from kljax.models.config import ModelConfig
from kljax.models.convert import load_hf_checkpoint


def test_a_backup_safetensors_beside_the_model_is_not_read(tmp_path):
    good = make_inputs(tmp_path)["good"]
    tensors = load_file(str(good / "model.safetensors"))
    save_file({k: v + 1.0 for k, v in tensors.items()}, str(good / "model-backup.safetensors"))
    params, _ = load_hf_checkpoint(good)
    np.testing.assert_array_equal(np.asarray(params["final_norm"]), tensors["model.norm.weight"])


@pytest.mark.parametrize("model_type,arch", [("qwen3", "Qwen3ForCausalLM"), ("llama", "LlamaForCausalLM"),
                                             ("qwen2", "Qwen2ForCausalLM")])
def test_missing_config_fields_default_as_in_transformers(model_type, arch):
    transformers = pytest.importorskip("transformers")
    hf = {k: v for k, v in TINY_HF.items() if k not in ("head_dim", "max_position_embeddings")}
    hf.update(architectures=[arch], model_type=model_type)
    ours = ModelConfig.from_hf(hf)
    theirs = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in hf.items() if k != "model_type"})
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert ours.head_dim == head_dim  # Qwen3: 128, not hidden_size // heads
    assert ours.max_position_embeddings == theirs.max_position_embeddings
