"""`kljax plan`: AOT-compiled memory plans on abstract shapes, checked against an analytic estimate.

The ~1B model is TinyLlama-1.1B's shape (22 layers, all of them: with scanned layers the train step
compiles one layer body, so the full depth costs no extra compile time), planned on the 8 simulated
devices of tests/conftest.py with mesh fsdp=8.
"""

from __future__ import annotations

import json

import jax
import pytest

from kljax.cli import main as cli_main
from kljax.config import load_run_config, with_overrides
from kljax.models.config import num_params
from kljax.studies import plan as plan_lib

ONE_B = {  # TinyLlama-1.1B's configuration
    "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}


def config_1b(tmp_path, **overrides):
    (tmp_path / "config.json").write_text(json.dumps(ONE_B))
    values = {"model.source": str(tmp_path), "rl.max_prompt_len": 64, "rl.max_new_tokens": 64, "rl.group_size": 2,
              **overrides}
    return load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in values.items()])


def test_parse_chip():
    assert plan_lib.parse_chip("v5e") == plan_lib.Chip("v5e", 16 * 2**30, None)
    assert plan_lib.parse_chip("v5e-64").devices == 64
    assert plan_lib.parse_chip("v5p-32") == plan_lib.Chip("v5p", 95 * 2**30, 16)  # 32 cores = 16 chips
    assert plan_lib.parse_chip("8xH100") == plan_lib.Chip("h100", 80 * 2**30, 8)
    assert plan_lib.parse_chip("a100-40").hbm_bytes == 40 * 2**30
    assert plan_lib.parse_chip("h200").hbm_bytes == 141 * 2**30
    with pytest.raises(ValueError, match="unknown chip 'tpu9'.*v5e"):
        plan_lib.parse_chip("tpu9")


def test_resolve_known_models():
    config = load_run_config("configs/paper_qwen25_7b_math.py")
    with pytest.raises(ValueError, match="known:qwen2.5-7b"):
        plan_lib.resolve_model(config.model)  # /path/to/Qwen2.5-7B does not exist
    config = with_overrides(config, ["--config.model.source=known:Qwen2.5-7B"])
    model, name = plan_lib.resolve_model(config.model)
    assert name == "qwen2.5-7b" and model.num_layers == 28 and model.dtype == "bfloat16"
    assert 7.6e9 < num_params(model) < 7.7e9


def test_1b_plan_matches_analytic_estimate(tmp_path):
    """params + Adam moments per device from the compiled train step vs. n_params * 4 B * 3 / 8."""
    devices = jax.devices()[:8]
    plan = plan_lib.make_plan(config_1b(tmp_path), (1, 8, 1), devices=devices, chip="v5e", programs=("train",))
    assert 1.0e9 < plan.num_params < 1.2e9
    analytic = plan_lib.analytic_state_bytes(plan.num_params, 4, 8)
    train = plan.programs["train"]
    assert abs(train.argument - analytic) / analytic < 0.25  # compiled arguments: state + the small batch
    assert abs(plan.params + plan.opt_state - analytic) / analytic < 0.01
    assert train.alias >= plan.params + plan.opt_state - 2**20  # the state is donated: updated in place
    assert train.temp > 0 and plan.peak == plan.phases["train"] > plan.resident
    assert train.largest and all(size > 0 for _, _, size in train.largest)
    assert plan.fits() is True and "v5e (16 GiB per device): FITS" in plan_lib.format_plan(plan)
    small = plan_lib.Chip("tiny-chip", 2**30)
    plan.chip = small
    assert plan.fits() is False and "DOES NOT FIT" in plan_lib.format_plan(plan)

    # bfloat16 parameters halve the resident state; full remat shrinks the train step's temporaries.
    lean = plan_lib.make_plan(config_1b(tmp_path, **{"model.param_dtype": "bfloat16", "model.remat": "full"}),
                              (1, 8, 1), devices=devices, programs=("train",), top=0)
    assert abs(lean.params * 2 - plan.params) < 2**20
    assert lean.programs["train"].temp < train.temp
    assert plan.ref_params == plan.params  # float32 compute: the reference is a float32 copy

    # bfloat16 compute over float32 parameters: the frozen reference and the async snapshot are held
    # in bfloat16 (`tfm.frozen_copy`), half the bytes; the trained parameters stay float32.
    mixed = plan_lib.make_plan(config_1b(tmp_path, **{"model.dtype": "bfloat16", "rl.async_level": 1}),
                               (1, 8, 1), devices=devices, programs=())
    assert mixed.params == plan.params and abs(mixed.ref_params * 2 - plan.params) < 2**20
    assert mixed.snapshots == mixed.ref_params
    assert mixed.resident == mixed.params + mixed.opt_state + 2 * mixed.ref_params


def test_cli_plan_all_programs(capsys):
    assert cli_main(["plan", "--config", "configs/tiny.py", "--mesh", "fsdp=4,tensor=2", "--chip", "v5e",
                     "--top", "2", "--no-roofline", "--cpu-compiler"]) == 0
    out = capsys.readouterr().out
    for text in ("on mesh data=1,fsdp=4,tensor=2 (8 devices)", "train step: activations", "sampler: activations",
                 "score: activations", "KV cache", "PEAK", "largest buffers", "v5e (16 GiB per device): FITS"):
        assert text in out, text


def test_cli_plan_starts_itself_with_more_devices(capfd):
    """16 devices > the 8 of this process: the command re-executes with a larger simulated count."""
    assert cli_main(["plan", "--config", "configs/tiny.py", "--mesh", "data=2,fsdp=4,tensor=2", "--programs",
                     "score", "--top", "0", "--json"]) == 0
    result = json.loads(capfd.readouterr().out)
    assert result["mesh"] == [2, 4, 2] and set(result["programs"]) == {"score"}
    assert result["fits"] is None and result["peak"] >= result["resident"] > 0


def test_cli_plan_mesh_errors(capsys):
    assert cli_main(["plan", "--config", "configs/tiny.py", "--mesh", "fsdp=3", "--programs", "score"]) == 2
    err = capsys.readouterr().err
    assert "rl.prompts_per_step=8 does not split over data*fsdp=3" in err and "no (data, fsdp, tensor) shape" in err
    assert cli_main(["plan", "--config", "configs/tiny.py", "--mesh", "fsdp=16", "--programs", "score"]) == 2
    assert "shapes that fit: data=1,fsdp=8,tensor=2" in capsys.readouterr().err  # checked before re-executing
    assert cli_main(["plan", "--config", "configs/tiny.py", "--mesh", "fsdp=-1"]) == 2
    assert "give --devices N" in capsys.readouterr().err
    assert cli_main(["plan", "--config", "configs/tiny.py", "--mesh", "fsdp=8", "--chip", "v5e-64"]) == 2
    assert "has 64 devices but the mesh" in capsys.readouterr().err


def test_a_chip_is_planned_with_the_programs_it_runs():
    """kernels=auto on this CPU host would pick the XLA-CPU kernels; a plan for a GPU/TPU chip compiles
    the plain-JAX programs that chip runs (it compiled the CPU kernels' before), and says which."""
    config = load_run_config("configs/tiny.py")
    devices = jax.devices("cpu")[:1]
    on_chip = plan_lib.make_plan(config, (1, 1, 1), devices=devices, chip="h100", programs=("score",))
    here = plan_lib.make_plan(config, (1, 1, 1), devices=devices, programs=("score",))
    assert on_chip.dtypes["kernels"] == "plain" and here.dtypes["kernels"] == "cpu"
    assert "kernels=plain" in plan_lib.format_plan(on_chip)
    chosen = with_overrides(config, ["--config.model.kernels=cpu"])  # asked for: kept
    assert plan_lib.make_plan(chosen, (1, 1, 1), devices=devices, chip="h100", programs=("score",)).dtypes[
        "kernels"] == "cpu"


def test_sampler_chunks_bound_the_planned_kv_cache():
    """rl.sampler_chunk: the sampler holds the cache of one chunk's rows, and the plan counts that."""
    config = load_run_config("configs/tiny.py")
    devices = jax.devices("cpu")[:2]
    whole = plan_lib.make_plan(config, (1, 2, 1), devices=devices, programs=("sample",), top=0)
    chunked = plan_lib.make_plan(with_overrides(config, ["--config.rl.sampler_chunk=2"]), (1, 2, 1),
                                 devices=devices, programs=("sample",), top=0)
    assert whole.shapes["sampler_chunk"] == 8 and chunked.shapes["sampler_chunk"] == 2
    assert chunked.kv_cache * 4 == whole.kv_cache
    assert chunked.programs["sample"].temp <= whole.programs["sample"].temp
    assert "sampler chunks of 2 prompts" in plan_lib.format_plan(chunked)
