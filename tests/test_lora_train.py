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

from kljax.config import load_run_config, with_overrides
from kljax.config.load import CONFIGS_DIR
from kljax.errors import UserError
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.models.tokenizers import DEFAULT_ALPHABET
from kljax.train.trainer import train

REPO_ROOT = CONFIGS_DIR.parent

TINY = REPO_ROOT / "configs" / "tiny.py"
TOY = REPO_ROOT / "configs" / "toy_transformer.py"


def _config(path: Path, *overrides: str):
    return load_run_config((path), [f"--config.{o}" for o in overrides])


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
    assert abs(rows[0]["kl_seq"]) < 1e-6  # adapters start at B = 0: the policy is its reference (up to rounding)
    assert rows[-1]["kl_seq"] != 0.0
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(whole["params"]), jax.device_get(parts["params"]))
    assert [r["loss"] for r in rows] == [r["loss"] for r in _rows(root / "parts")]
    trained = {k for k in whole["params"]["layers"] if lora.is_adapter(k)}
    assert trained == {f"{t}_lora_{m}" for t in ("q", "v", "o", "down") for m in "ab"}
    # The checkpoint holds the adapters and their moments, not the base: the arrays orbax recorded.
    # (Its files' total size is no test at this scale: orbax's metadata, 30-60 KB and varying with
    # how its writes were compacted, is of the tiny base's size, 81 KB.)
    from kljax.train.checkpoint_shapes import stored_table

    stored = stored_table(root / "whole" / "checkpoints" / "4" / "state")
    weights = {p: shape for p, (shape, _) in stored.items() if ".params." in f".{p}." or ".mu." in p or ".nu." in p}
    assert {p.rsplit(".", 1)[1] for p in weights} == trained and len(weights) == 3 * len(trained)
    saved = 4 * sum(int(np.prod(shape)) for shape in weights.values())
    assert saved == 3 * 4 * sum(x.size for k, x in whole["params"]["layers"].items() if lora.is_adapter(k))
    assert saved < (base / "model.safetensors").stat().st_size / 5


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
            train(with_overrides(config, ["--config.steps=6"]), workdir, resume=True, progress=False)
    finally:
        shutil.copy2(tmp_path / "kept.safetensors", weights)


def test_export_merged_and_peft_give_the_same_logits(lora_run, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from kljax.train.export import export_run

    root, base, config, whole, _ = lora_run
    merged_dir, _ = export_run(root / "whole", tmp_path / "merged")
    import kljax

    run = kljax.RLTrainer(workdir=root / "whole", resume=True)  # the Python API's path to the same export
    with pytest.raises(UserError, match="format='lora' is not one of 'merged', 'peft'"):
        run.save_pretrained(tmp_path / "bad", format="lora")
    peft_dir = run.save_pretrained(tmp_path / "peft", format="peft")
    assert {p.name for p in peft_dir.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}

    tokens = np.random.default_rng(0).integers(1, 19, size=(2, 6)).astype(np.int32)
    from kljax.train.policy import tiny_model_config

    model = tiny_model_config(config.model, 19)
    model = model.__class__(**{**model.__dict__, "lora": config.model.lora.adapters()})
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


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def test_build_holds_one_base_copy_in_the_compute_dtype_and_trains_only_the_adapters():
    """bfloat16 compute over float32 weights: the run keeps one bfloat16 copy of the base (the
    reference, and the policy with the adapters), the state only the float32 adapters and their Adam
    moments; an iteration leaves the base bit for bit and moves the adapters."""
    import gc

    import jax.numpy as jnp

    from kljax.train.run_build import build
    from kljax.train.trainer import iteration

    config = _config(TINY, "model.lora.rank=2", "model.dtype=bfloat16", "model.scan_layers=False",
                     "mesh.fsdp=4", "mesh.tensor=2", "optim.learning_rate=0.05")
    gc.collect()
    before = {id(x): x for x in jax.live_arrays()}  # held, so their ids cannot be reused
    run, state, ref_params = build(config)
    gc.collect()
    new = [x for x in jax.live_arrays() if id(x) not in before]
    assert run.base is ref_params and run.policy.params is None
    assert {x.dtype for x in jax.tree.leaves(ref_params)} == {jnp.dtype(jnp.bfloat16)}
    assert not any(lora.is_adapter(k) for k in ref_params["layers"])
    assert set(state.params) == {"layers"} and all(lora.is_adapter(k) for k in state.params["layers"])
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    adapters = _nbytes(state.params)
    assert _nbytes(state.opt_state) < 2 * adapters + 1024  # Adam's two moments of the adapters, no more
    # Live: the bfloat16 base once, the state, small arrays (keys, counters); a float32 copy of the base
    # (2x the bfloat16 bytes) or a second bfloat16 copy would not fit under this bound.
    assert sum(x.nbytes for x in new) < _nbytes(ref_params) * 1.5 + _nbytes(state)
    frozen, initial = jax.device_get(ref_params), jax.device_get(state.params)
    state = iteration(run, state, ref_params, 0, beta=float(run.config.kl.beta)).state
    jax.tree.map(np.testing.assert_array_equal, frozen, jax.device_get(ref_params))
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), initial, jax.device_get(state.params))
    # at B = 0 only B has a gradient (dL/dA = s G B^T = 0): every B moved off zero
    assert min(v for k, v in moved["layers"].items() if k.endswith("_lora_b")) > 0


def test_python_api_takes_the_lora_fields(tmp_path):
    """kljax.RLTrainer(config=...) sets model.lora as dotted keys or nested dicts; a bad rank is named."""
    import kljax

    flat = kljax.RLTrainer(model="tiny", config={"model.lora.rank": 4, "model.lora.targets": "q,v"},
                           workdir=tmp_path / "a", progress=False)
    nested = kljax.RLTrainer(model="tiny", config={"model": {"lora": {"rank": 4, "alpha": 8.0}}},
                             workdir=tmp_path / "b", progress=False)
    assert flat.config.model.lora.adapters() == lora.LoraConfig(4, 16.0, ("q", "v"))
    assert nested.config.model.lora.adapters() == lora.LoraConfig(4, 8.0, lora.TARGETS)
    with pytest.raises((UserError, ValueError), match="model.lora.rank"):
        kljax.RLTrainer(model="tiny", config={"model.lora.rank": -1}, workdir=tmp_path / "c", progress=False)
