"""`kljax plan` with the TPU compiler (deviceless slices, the `tpu` extra; skipped without libtpu) and
the roofline: slice topologies, costs extrapolated from 1- and 2-layer programs equal the compiled
L-layer program's, and the step bound is the sum of its phases'."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest

from kljax.cli import main as cli_main
from kljax.config import load_run_config, with_overrides
from kljax.parallel import sharding as shd
from kljax.studies import plan as plan_lib
from kljax.studies import plan_cost, plan_programs
from kljax.studies.roofline import Cost, Roofline, compiled_cost, extrapolate_layers, model_flops
from kljax.studies.tpu_topology import libtpu_version, topology_name, tpu_devices

needs_libtpu = pytest.mark.skipif(libtpu_version() is None, reason="the tpu extra (libtpu) is not installed")


def test_topology_names():
    assert topology_name("v5e", 64) == ("v5e:8x8", {})
    assert topology_name("v6e", 8) == ("v6e:2x4", {})
    assert topology_name("v5e", 1) == ("v5e:1x1", {"chips_per_host_bounds": (1, 1, 1)})
    assert topology_name("v5p", 4) == ("v5p:2x2x1", {"chip_config_name": "megacore"})
    assert [topology_name("v4", n)[0] for n in (8, 16, 32, 64, 128)] == [
        "v4:2x2x2", "v4:2x2x4", "v4:2x4x4", "v4:4x4x4", "v4:4x4x8"]
    with pytest.raises(ValueError, match="slices of 1, 2, 4, 8"):
        topology_name("v5e", 12)
    with pytest.raises(ValueError, match="h100 is not a TPU"):
        topology_name("h100", 8)


def test_roofline_arithmetic():
    c = Cost(4e12, 1e9)
    assert c.seconds(2e12, 1e9) == 2.0 and c.seconds(1e15, 1e8) == 10.0
    one, two = Cost(10, 100), Cost(16, 130)
    assert extrapolate_layers(one, two, 5) == Cost(10 + 4 * 6, 100 + 4 * 30)
    flops = model_flops(1000, prompts=2, group=3, prompt_len=4, new_tokens=5, score_forwards=2, lora=True)
    assert flops == {"sample": 2 * 1000 * (2 * 4 + 6 * 5), "score": 2 * 1000 * 6 * 9 * 2, "train": 4 * 1000 * 6 * 9}
    r = Roofline("v5e", 4, 1e12, 1e9, {"sample": Cost(1e12, 5e9), "train": Cost(3e12, 1e9)}, 1000, 8e12)
    assert r.phase_seconds() == {"sample": 5.0, "train": 3.0} and r.step_seconds == 8.0
    assert r.tokens_per_s_per_chip == 1000 / 8 / 4 and r.mfu_ceiling == 8e12 / (8 * 1e12 * 4)


def _settings_and_model(config):
    settings, model, _, _ = plan_lib.check_plan(config, (1, 2, 1), 2)
    return settings, dataclasses.replace(model, kernels="plain")


def test_layer_extrapolation_equals_the_compiled_program():
    """XLA's cost analysis counts a loop body once; the unrolled L-layer program's cost is what the
    1- and 2-layer programs extrapolate to (every layer costs the same)."""
    config = load_run_config(("configs/tiny.py"), ["--config.model.tiny.num_layers=2"])
    settings, model = _settings_and_model(config)
    mesh = shd.make_mesh(1, 2, 1, devices=jax.devices("cpu")[:2])
    batch = plan_programs.abstract_batch(mesh, 16, 16, 6)
    cost = lambda layers, scan: compiled_cost(plan_programs.lower_score(plan_programs.abstract_run(
        dataclasses.replace(model, num_layers=layers, scan_layers=scan), settings, mesh), batch, 1).compile())
    full = cost(4, False)
    predicted = extrapolate_layers(cost(1, False), cost(2, False), 4)
    assert predicted.flops == pytest.approx(full.flops, rel=1e-3)
    assert predicted.bytes == pytest.approx(full.bytes, rel=0.05)
    assert cost(4, True).flops < 0.6 * full.flops  # scanned: the body counted once


def test_step_costs_scale_with_micro_batches_and_chunks():
    config = load_run_config("configs/tiny.py")
    settings, model = _settings_and_model(config)
    mesh = shd.make_mesh(1, 2, 1, devices=jax.devices("cpu")[:2])
    costs, _ = plan_cost.step_costs(model, settings, mesh, ("train", "score", "sample"))
    micro = with_overrides(config, ["--config.rl.micro_batches=2", "--config.rl.sampler_chunk=4"])
    settings2, _ = _settings_and_model(micro)
    costs2, _ = plan_cost.step_costs(model, settings2, mesh, ("score", "sample"))
    assert costs2["score"].flops == pytest.approx(costs["score"].flops, rel=0.02)  # half the rows, twice
    assert costs2["sample"].flops == pytest.approx(costs["sample"].flops, rel=0.05)
    assert costs["train"].flops > 2 * costs["score"].flops / 2  # forward + backward > one forward


@needs_libtpu
def test_tpu_plan_uses_the_tpu_compiler_and_prints_a_step_time():
    chip = plan_lib.parse_chip("v5e-4")
    plan = plan_lib.make_plan(load_run_config("configs/tiny.py"), (1, 4, 1), devices=tpu_devices(chip, 4), chip=chip,
                              top=0, roofline=True)
    r = plan.roofline
    assert r.step_seconds == pytest.approx(sum(r.phase_seconds().values())) and r.step_seconds > 0
    assert 0 < r.mfu_ceiling <= 1 and set(r.phases) == {"train", "score", "sample"}
    out = plan_lib.format_plan(plan)
    for text in ("compiled by TPU compiler (libtpu ", "deviceless TPU v5 lite slice of 4 chips",
                 "mesh data=1,fsdp=4,tensor=1", "v5e (16 GiB per device): FITS", "step time >= ", "tokens/s per chip",
                 "MFU ceiling"):
        assert text in out, text


@needs_libtpu
def test_tpu_and_cpu_plans_agree_on_the_exact_parts(capfd):
    """Parameters, optimizer state, reference and KV cache are counted from shard shapes: the same
    whichever compiler."""
    argv = ["plan", "--config", "configs/tiny.py", "--chip", "v5p-8", "--top", "0", "--json", "--no-roofline",
            "--config.model.dtype=bfloat16", "--config.model.lora.rank=4"]
    assert cli_main(argv) == 0
    tpu = json.loads(capfd.readouterr().out)
    assert cli_main(argv + ["--cpu-compiler"]) == 0
    cpu = json.loads(capfd.readouterr().out)
    assert tpu["compiler"].startswith("TPU compiler") and cpu["compiler"].startswith("XLA:CPU")
    for key in ("params", "opt_state", "ref_params", "kv_cache", "resident"):
        assert tpu[key] == cpu[key] > 0, key
    assert tpu["roofline"] is None and tpu["lora"]["rank"] == 4
