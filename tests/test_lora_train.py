"""LoRA through the trainer: the reference is the base (KL 0 at the first step), checkpoints hold the
adapters and check the base they were trained on, resume equals uninterrupted, `kljax export`
writes a merged HF model and a PEFT adapter directory that transformers / peft load with the same
logits, and the exact-optimum toy task's gap identity holds for a LoRA policy on 8 devices."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from kljax.errors import UserError
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.models.tokenizers import DEFAULT_ALPHABET
from kljax.train.config import REPO_ROOT, apply_overrides, load_config
from kljax.train.trainer import train

TINY = REPO_ROOT / "configs" / "tiny.py"
TOY = REPO_ROOT / "configs" / "toy_transformer.py"


def _config(path: Path, *overrides: str):
    return apply_overrides(load_config(path), [f"--config.{o}" for o in overrides])


def _rows(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _base_model(out: Path, seed: int) -> Path:
    """A tiny random model over the character tokenizer, as an HF checkpoint directory."""
    from kljax.parallel import sharding as shd
    from kljax.train.policy import load_policy
    from kljax.train.sft import export_char_model

    config = _config(TINY, f"seed={seed}")
    policy = load_policy(config.model, shd.make_mesh(1, 1, 1, devices=jax.devices()[:1]), seed=seed)
    return export_char_model(jax.device_get(policy.params), policy.model, out, DEFAULT_ALPHABET)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = _base_model(root / "base", seed=0)
    config = _config(TINY, f"model.source={base}", "model.lora.rank=2", "model.lora.targets=q,v,o,down",
                     "steps=4", "checkpoint_every=2", "rl.prompts_per_step=4", "eval_examples=4",
                     "optim.learning_rate=0.05", "mesh.fsdp=4", "mesh.tensor=2")
    whole = train(config, root / "whole", progress=False)
    assert train(config, root / "parts", progress=False, stop_after=2)["stopped_at"] == 2
    parts = train(config, root / "parts", resume=True, progress=False)
    return root, base, config, whole, parts


def test_reference_is_the_base_and_resume_equals_uninterrupted(lora_run):
    root, base, _, whole, parts = lora_run
    rows = _rows(root / "whole")
    assert rows[0]["kl_seq"] == 0.0  # adapters start at B = 0: the policy is its reference, the base
    assert rows[-1]["kl_seq"] != 0.0
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(whole["params"]), jax.device_get(parts["params"]))
    assert [r["loss"] for r in rows] == [r["loss"] for r in _rows(root / "parts")]
    trained = {k for k in whole["params"]["layers"] if lora.is_adapter(k)}
    assert trained == {f"{t}_lora_{m}" for t in ("q", "v", "o", "down") for m in "ab"}
    # the checkpoint holds the adapters and their moments, not the base
    ckpt_bytes = sum(f.stat().st_size for f in (root / "whole" / "checkpoints" / "4").rglob("*") if f.is_file())
    base_bytes = (base / "model.safetensors").stat().st_size
    assert ckpt_bytes < base_bytes


def test_resume_on_another_base_is_refused(lora_run, tmp_path):
    """The same source path holding other weights (a re-downloaded or edited base) is refused by its
    content hash; a changed model.source is refused by the resume check already."""
    import shutil

    root, base, config, _, _ = lora_run
    workdir = tmp_path / "run"
    shutil.copytree(root / "parts", workdir)
    other = _base_model(tmp_path / "other", seed=1)
    weights = base / "model.safetensors"
    shutil.copy2(weights, tmp_path / "kept.safetensors")
    try:
        shutil.copy2(other / "model.safetensors", weights)
        with pytest.raises(UserError, match="adapters only apply to the base they were trained on"):
            train(apply_overrides(config, ["--config.steps=6"]), workdir, resume=True, progress=False)
    finally:
        shutil.copy2(tmp_path / "kept.safetensors", weights)


def test_export_merged_and_peft_give_the_same_logits(lora_run, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from kljax.cli.export import export_run

    root, base, config, whole, _ = lora_run
    merged_dir, _ = export_run(root / "whole", tmp_path / "merged")
    peft_dir, _ = export_run(root / "whole", tmp_path / "peft", fmt="peft")
    assert {p.name for p in peft_dir.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}

    tokens = np.random.default_rng(0).integers(1, 19, size=(2, 6)).astype(np.int32)
    from kljax.train.policy import tiny_model_config

    model = tiny_model_config(config.model, 19)
    model = model.__class__(**{**model.__dict__, "lora": lora.from_section(config.model)})
    ours = np.asarray(tfm.apply(jax.device_get(whole["params"]), tokens, config=model))
    plain = np.asarray(tfm.apply(lora.base_of(jax.device_get(whole["params"])), tokens, config=model))
    assert np.abs(ours - plain).max() > 1e-3  # the adapters changed the model

    ids = torch.tensor(tokens, dtype=torch.long)
    with torch.no_grad():
        hf = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
        np.testing.assert_allclose(hf(ids).logits.numpy(), ours, atol=2e-4)
        base_model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        with_adapter = peft.PeftModel.from_pretrained(base_model, peft_dir).eval()
        np.testing.assert_allclose(with_adapter(ids).logits.numpy(), ours, atol=2e-4)


def test_toy_transformer_lora_run_keeps_the_gap_identity_on_8_devices(tmp_path):
    """The exact-enumeration task with a LoRA policy over the tiny transformer, sharded over 8 devices:
    pi_ref is the base (KL 0 before training), J(pi*) - J(pi) = beta KL(pi || pi*) in every row."""
    config = _config(TOY, "steps=3", "checkpoint_every=3", "mesh.data=4", "mesh.tensor=2",
                     "rl.prompts_per_step=12", "model.lora.rank=2", "optim.learning_rate=0.05")
    train(config, tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    before = json.loads((tmp_path / "run" / "exact_before.json").read_text())
    assert before["exact/kl_seq"] == pytest.approx(0.0, abs=1e-6) and before["exact/gap"] > 0.05
    for r in [before, *rows]:
        assert r["exact/J_opt"] - r["exact/J"] == pytest.approx(r["exact/gap"], abs=2e-5)
    assert rows[-1]["exact/gap"] < before["exact/gap"]
