"""The embedded SmolLM2-135M-Instruct: GGUF -> HF dir once per session, parity with transformers."""

import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from kljax.cli import main  # noqa: E402
from kljax.models import default  # noqa: E402
from kljax.models.convert import check_vocab, load_hf_checkpoint  # noqa: E402
from kljax.models.transformer import apply  # noqa: E402
from kljax.sampling import greedy_continuations, left_pad  # noqa: E402
from kljax.studies.parity import prompt_token_ids, transformers_logits  # noqa: E402

PROMPTS = ("What is 7 times 8?", "Write one sentence about the sea.", "Name a prime number.")


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(cache root, HF dir, transformers model, tokenizer, kljax params, config), converted once."""
    root = tmp_path_factory.mktemp("kljax_cache")
    path = default.default_model_dir(root)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    params, config = load_hf_checkpoint(path)
    return root, path, model, tokenizer, params, config


def test_default_dir_is_a_plain_hf_checkpoint(smollm2):
    root, path, model, tokenizer, _, config = smollm2
    hf_config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in hf_config and hf_config["architectures"] == ["LlamaForCausalLM"]
    assert not (path / "model.safetensors.index.json").exists() and (path / "model.safetensors").is_file()
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert config.tie_embeddings and config.num_layers == 30 and config.vocab_size == 49152
    check_vocab(config, len(tokenizer))
    assert default.default_model_dir(root) == path  # cached: no second conversion
    assert sorted(p.name for p in root.iterdir()) == [path.name]  # no temp dirs left behind


def test_logits_match_transformers_on_chat_prompts(smollm2):
    _, path, model, _, params, config = smollm2
    token_lists = prompt_token_ids(path, PROMPTS)
    tokens, mask = left_pad(token_lists, pad_id=config.pad_token_id)
    ours = np.asarray(jax.jit(apply, static_argnames="config")(params, tokens, mask, config=config))
    ref = transformers_logits(model, tokens, mask)
    diff = float(np.abs(ours - ref)[mask].max())
    print(f"SmolLM2-135M-Instruct float32: max_abs_diff={diff:.3e} over {int(mask.sum())} tokens")
    assert diff < 1e-3
    assert (ours[mask].argmax(-1) == ref[mask].argmax(-1)).mean() > 0.99


def test_greedy_continuation_matches_transformers_generate(smollm2):
    _, path, model, tokenizer, params, config = smollm2
    token_lists = prompt_token_ids(path, PROMPTS)
    ours = greedy_continuations(params, config, token_lists, 8, config.eos_token_ids, config.pad_token_id)
    tokens, mask = left_pad(token_lists, pad_id=config.pad_token_id)
    with torch.no_grad():  # one left-padded batch, like ours
        out = model.generate(
            torch.from_numpy(tokens.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)),
            max_new_tokens=8, do_sample=False, pad_token_id=config.pad_token_id,
        )
    for got, want in zip(ours, out[:, tokens.shape[1]:].tolist(), strict=True):
        want = want[: want.index(config.pad_token_id) + 1] if config.pad_token_id in want else want
        assert got == want, (tokenizer.decode(got), tokenizer.decode(want))


def test_cli_default_model_and_generate(smollm2, monkeypatch, capsys):
    root, path, *_ = smollm2
    monkeypatch.setenv("KLJAX_CACHE", str(root))
    assert default.cache_root() == root
    assert main(["convert", "--default-model"]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    argv = ["generate", "--prompt", "What is the capital of France?", "--chat", "--max-new-tokens", "8"]
    assert main(argv) == 0
    assert "Paris" in capsys.readouterr().out


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    def crash(gguf, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(default, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        default.default_model_dir(tmp_path)
    assert os.listdir(tmp_path) == []
