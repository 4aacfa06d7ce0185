"""The RL loop end to end on the tiny config: learning, exact resume, validation, plots."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from kljax.cli import main as cli_main
from kljax.config import load_run_config
from kljax.train.metrics import deterministic, read_jsonl
from kljax.train.trainer import train

# The tiny config sharded over the 8 simulated devices: fsdp=4 x tensor=2.
MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def tiny(**overrides):
    overrides = {**MESH, **overrides}
    return load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in overrides.items()])


def stable(rows):
    return [deterministic(r) for r in rows]


def test_reward_rises_with_k1_in_reward(tmp_path):
    summary = train(tiny(steps=100), tmp_path, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 100
    first = np.mean([r["reward"] for r in rows[:10]])
    last = np.mean([r["reward"] for r in rows[-10:]])
    assert last > first + 0.1, (first, last)
    assert summary["after"]["test"]["reward"] > summary["before"]["test"]["reward"]
    after = json.loads((tmp_path / "eval_after.json").read_text())["test"]  # issue 46's fields, as scripts read them
    for kind in ("greedy", "sampled"):
        assert {"accuracy", "ci95", "n"} <= set(after[kind]) and after[kind]["n"] == 64
        assert {"diff", "ci95"} <= set(after["delta_vs_before"][kind])
    assert after["delta_vs_before"]["sampled"]["ci95"][0] > 0  # the policy trained measurably learned
    for key in ("k1", "k2", "k3", "kl_seq", "entropy", "grad_norm", "clip_fraction", "ratio_mean",
                "response_length", "tokens_per_s", "time_sample", "time_score", "time_update", "kl_penalty"):
        assert key in rows[0], key
    # On-policy with one update per batch the importance ratio is 1 up to float rounding.
    assert all(abs(r["ratio_mean"] - 1) < 1e-4 for r in rows)
    assert (tmp_path / "tb").is_dir()


# The second case keeps the reference and the async snapshot in bfloat16 (`tfm.frozen_copy`).
@pytest.mark.parametrize("overrides", [{}, {"model.dtype": "bfloat16", "rl.async_level": 1}])
def test_resume_equals_uninterrupted(tmp_path, overrides):
    config = tiny(steps=6, checkpoint_every=100, **overrides)
    full = train(config, tmp_path / "full", progress=False)
    first = train(config, tmp_path / "split", progress=False, stop_after=3)
    assert first["stopped_at"] == 3
    with pytest.raises(ValueError, match="--resume"):
        train(config, tmp_path / "split", progress=False)
    resumed = train(config, tmp_path / "split", resume=True, progress=False)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(full["params"]), jax.device_get(resumed["params"]))
    a = stable(read_jsonl(tmp_path / "full" / "metrics.jsonl"))
    b = stable(read_jsonl(tmp_path / "split" / "metrics.jsonl"))
    assert a == b
    tokens = [r["num_tokens"] for r in b]  # TRL's cumulative count goes on from the checkpoint, not from 0
    assert tokens == sorted(tokens) and tokens[3] > tokens[2] > 0


def test_async_level_samples_with_stale_params(tmp_path):
    train(tiny(steps=4, **{"rl.async_level": 2}), tmp_path, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert abs(rows[0]["ratio_mean"] - 1) < 1e-4  # step 1 samples with the initial params = current
    assert max(abs(r["ratio_mean"] - 1) for r in rows[2:]) > 1e-4  # later: 2 updates stale


@pytest.mark.parametrize(
    "override, message",
    [
        ({"kl.beta": -1.0}, r"kl\.beta"),
        ({"kl.estimator": "k9"}, r"kl\.estimator='k9'"),
        ({"rl.group_size": 1}, r"rl\.group_size=1"),
        ({"rl.micro_batches": 3}, r"rl\.micro_batches=3"),
        ({"task.prompt_format": "fancy"}, r"prompt_format"),
    ],
)
def test_invalid_configs_fail_before_compiling(override, message):
    with pytest.raises(ValueError, match=message):
        tiny(**override)


def test_override_errors():
    with pytest.raises(ValueError, match="unknown key kl.bta \\(did you mean 'beta'\\?\\)"):
        load_run_config(("configs/tiny.py"), ["--config.kl.bta=0.1"])
    with pytest.raises(ValueError, match="config.steps='many' is a str; expected an int"):
        load_run_config(("configs/tiny.py"), ["--config.steps=many"])


def test_cli_train_and_plot(tmp_path, capsys):
    work = tmp_path / "run"
    assert cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(work), "--no-progress",
                     "--config.steps=3", "--config.mesh.fsdp=4", "--config.mesh.tensor=2",
                     "--config.kl.estimator=k3", "--config.kl.placement=loss"]) == 0
    out = capsys.readouterr().out
    assert "before -> after" in out
    assert json.loads(out.strip().splitlines()[-1])["workdir"] == str(work)
    assert cli_main(["plot-run", str(work)]) == 0
    assert (work / "curves.png").stat().st_size > 10_000


def test_plain_and_cpu_kernels_train_alike(tmp_path):
    """model.kernels=plain (jax.nn.dot_product_attention, optax's own update, the plain decode loop)
    and =cpu (the XLA-CPU kernels, the in-place update) run the same RL steps: same samples, losses
    and parameters to float32 rounding (Adam normalizes each update, so a weight whose gradient is
    near zero can move by up to about the learning rate on rounding alone: that is the tolerance)."""
    config = tiny(steps=3)
    lr = float(config.optim.learning_rate)
    runs = {k: train(tiny(steps=3, **{"model.kernels": k}), tmp_path / k, progress=False) for k in ("plain", "cpu")}
    rows = {k: read_jsonl(tmp_path / k / "metrics.jsonl") for k in runs}
    for a, b in zip(rows["plain"], rows["cpu"], strict=True):
        assert a["reward"] == b["reward"] and a["response_length"] == b["response_length"]
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-6)
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(runs[k]["params"]))])
            for k in ("plain", "cpu"))
    close = np.isclose(a, b, rtol=1e-4, atol=1e-6)
    assert close.mean() > 0.999 and np.max(np.abs(a - b)) <= 3 * lr, (close.mean(), np.max(np.abs(a - b)))
