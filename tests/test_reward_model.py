"""Reward models: tiny random HF *ForSequenceClassification checkpoints scored in JAX match transformers'
scores in float32 (last non-pad token), sharded over the mesh, and combined with reward functions."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from benchmarks.rl import save_char_tokenizer  # noqa: E402
from kljax.config import load_run_config  # noqa: E402
from kljax.models.reward_model import load_reward_model, reward_scores  # noqa: E402
from kljax.models.tiny import TINY_FAMILIES  # noqa: E402
from kljax.tasks import get_task  # noqa: E402
from kljax.tasks.base import Example  # noqa: E402
from kljax.train.reward_model_run import reward_from_config  # noqa: E402


def save_tiny_reward_model(family: str, out_dir, seed: int = 0):
    """A float32 `family` sequence classifier (num_labels 1, pad id 0) with every parameter random."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    kwargs = dict(TINY_FAMILIES[family])
    config = AutoConfig.for_model(kwargs.pop("model_type"), num_labels=1, pad_token_id=0, **kwargs)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.3 * noise)
    model.save_pretrained(out_dir)
    return model


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_scores_match_transformers_in_float32(tmp_path, family):
    model = save_tiny_reward_model(family, tmp_path)
    rng = np.random.default_rng(0)
    lengths = [9, 4, 12, 1]
    ids = np.zeros((4, 12), np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, 96, n)  # right-padded with the pad id 0
    mask = ids != 0
    with torch.no_grad():
        want = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64))).logits[:, 0]
    rm = load_reward_model(tmp_path)
    got = reward_scores(rm.params, rm.score, ids.astype(np.int32), mask, config=rm.config)
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=2e-5, rtol=1e-5)
    assert np.std(want.numpy()) > 1e-3  # the rows score differently: the pooled position matters


def test_unsupported_checkpoints_are_refused(tmp_path):
    from kljax.models.tiny import save_tiny_hf_model

    save_tiny_hf_model("llama3", tmp_path / "lm")
    with pytest.raises(ValueError, match=r"architecture \['LlamaForCausalLM'\] is not supported; supported: "
                                         r"\['LlamaForSequenceClassification'"):
        load_reward_model(tmp_path / "lm")


def test_reward_model_with_functions_on_a_mesh(tmp_path):
    from kljax.parallel import sharding as shd

    save_tiny_reward_model("qwen3", tmp_path / "rm")
    save_char_tokenizer(tmp_path / "rm", vocab_size=96)
    config = load_run_config(("configs/tiny.py"), [
        f"--config.reward.model={tmp_path / 'rm'}", "--config.reward.functions=format",
        "--config.reward.model_weight=0.5"])
    mesh = shd.make_mesh(1, 4, 2)
    rewards = reward_from_config(config, get_task("repeat_digit"), mesh)
    examples = [Example(f"say {i}", str(i), "x", "train", str(i)) for i in range(3)]
    completions = ["\\boxed{1}", "two", "Answer: 3"]
    result = rewards(examples, completions)
    rm = load_reward_model(tmp_path / "rm")
    ids, mask = rewards.functions[1][1].encode([e.prompt for e in examples], completions)
    alone = np.asarray(reward_scores(rm.params, rm.score, ids, mask, config=rm.config))
    np.testing.assert_allclose(result.parts["reward_model"], alone, atol=1e-5)
    np.testing.assert_allclose(result.rewards, result.parts["format"] + 0.5 * alone, atol=1e-5)
    assert result.parts["format"].tolist() == [1.0, 0.0, 1.0] and "rewards/reward_model/mean" in result.metrics

