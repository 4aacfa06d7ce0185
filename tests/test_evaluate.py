"""Evaluation: pass@k against subset enumeration, mean@k, and the same greedy accuracy whichever way
a model is loaded (in memory, exported HF checkpoint, `kljax train` workdir checkpoint)."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import jax
import numpy as np
import pytest

from kljax.cli import main as cli_main
from kljax.config import load_run_config
from kljax.models.tokenizers import DEFAULT_ALPHABET, CharTokenizer
from kljax.studies import evaluate as ev
from kljax.train import restore
from kljax.train.policy import Policy

MESH = ["--config.mesh.data=1", "--config.mesh.fsdp=4", "--config.mesh.tensor=2"]


def test_pass_at_k_equals_subset_enumeration():
    """pass@k = P(a uniformly random k-subset of the n samples holds a correct one), by enumeration."""
    for n in range(1, 9):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
                assert ev.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    """The product form matches exact rational arithmetic where C(n, k) is astronomically large."""
    for n, c, k in [(1000, 3, 100), (500, 250, 200), (2000, 1, 1), (300, 0, 10)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert ev.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-15)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        ev.pass_at_k(4, 1, 5)


def test_mean_at_k_and_pass_at_1():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    assert ev.mean_at_k(correct) == pytest.approx(6 / 12)
    # pass@1 is the per-prompt fraction correct, averaged: the same as mean@k with equal n per prompt.
    assert ev.mean_pass_at_k(correct, 1) == pytest.approx(ev.mean_at_k(correct))
    # With k = n, pass@k is "any of the n samples is correct".
    assert ev.mean_pass_at_k(correct, 4) == pytest.approx(2 / 3)
    assert ev.mean_pass_at_k(correct, 2) == pytest.approx((1 - 1 / 6 + 0 + 1) / 3)


def test_task_specs_and_domains():
    splits = ev.parse_tasks("arithmetic:test,arithmetic:ood_digits,repeat_digit")
    assert [s.spec for s in splits] == ["arithmetic:test", "arithmetic:ood_digits", "repeat_digit:test"]
    assert [ev.domain(s, "arithmetic") for s in splits] == ["in", "ood", "ood"]
    with pytest.raises(ValueError, match="no split 'nope'"):
        ev.parse_tasks("arithmetic:nope")


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    """A tiny model taught repeat_digit by a short SFT, in memory and exported as a HF checkpoint dir."""
    from kljax.train.sft import SFTSettings, export_char_model, train_sft

    settings = SFTSettings(task="repeat_digit", eval_splits="test", alphabet=DEFAULT_ALPHABET, hidden_size=32,
                           intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                           steps=40, batch_size=32, learning_rate=1e-2, warmup_steps=5, max_prompt_len=4,
                           max_answer_len=1)
    params, config, losses, _ = train_sft(settings, progress=False)
    assert losses[-1] < 0.5 * losses[0]
    out = export_char_model(params, config, tmp_path_factory.mktemp("sft") / "model", DEFAULT_ALPHABET)
    return params, config, out


def test_eval_in_memory_equals_exported_hf_checkpoint(sft_model, tmp_path):
    from kljax.models import transformer as tfm
    from kljax.parallel import sharding as shd

    params, config, model_dir = sft_model
    tok = CharTokenizer()
    run_config = load_run_config("configs/tiny.py")
    mesh = restore.make_mesh(run_config)  # the mesh the CLI uses, so the second evaluation compiles nothing new
    params = jax.device_put(params, shd.logical_to_sharding(tfm.logical_axes(config), tfm.param_shapes(config), mesh))
    policy = Policy(config, params, None, tok, (tok.eos_token_id,), tok.pad_token_id)
    settings = ev.EvalSettings.from_run_config(run_config, k=2, n_examples=16)
    memory = ev.evaluate(policy, params, ev.parse_tasks("repeat_digit:test"), settings, mesh, progress=False)
    out = tmp_path / "eval.json"
    assert cli_main(["eval", "--model", str(model_dir), "--config", "configs/tiny.py", "--tasks", "repeat_digit:test",
                     "--k", "2", "--n-examples", "16", "--json", str(out), "--no-progress"]) == 0
    exported = json.loads(out.read_text())["results"]["repeat_digit:test"]
    mem = memory["repeat_digit:test"]
    assert mem["greedy_accuracy"] > 0.5  # the SFT taught the task, so the comparison is not 0 == 0
    assert exported["greedy_accuracy"] == mem["greedy_accuracy"]
    assert exported["greedy_completions"] == mem["greedy_completions"]
    for r in (mem, exported):
        assert r["k"] == 2 and r["n_samples"] == 2 and r["n"] == 16
        assert 0 <= r["mean_at_k"] <= r["pass_at_k"] <= 1


def test_eval_cli_tiny_equals_its_export(tmp_path):
    """`--model tiny` (random init from configs/tiny.py) and `--model DIR` of its HF export agree."""
    from kljax.train.sft import export_char_model

    run_config = load_run_config("configs/tiny.py")
    policy = restore.load_model(run_config, restore.make_mesh(run_config))
    model_dir = export_char_model(policy.params, policy.model, tmp_path / "tiny_hf", DEFAULT_ALPHABET)
    results = []
    for model in ("tiny", str(model_dir)):
        out = tmp_path / f"{len(results)}.json"
        assert cli_main(["eval", "--model", model, "--config", "configs/tiny.py", "--tasks", "repeat_digit",
                         "--k", "2", "--n-examples", "16", "--json", str(out), "--no-progress"]) == 0
        results.append(json.loads(out.read_text())["results"]["repeat_digit:test"])
    assert results[0]["greedy_reward"] == results[1]["greedy_reward"]
    assert results[0]["greedy_accuracy"] == results[1]["greedy_accuracy"]
    assert results[0]["greedy_completions"] == results[1]["greedy_completions"]


def test_eval_checkpoint_matches_trainer(tmp_path, capsys):
    """A `kljax train` workdir (async level 2, so the checkpoint also holds sampler snapshots):
    restore_params gives the trained params, and `kljax eval` reproduces the trainer's eval_after: the
    same problems, greedy and sampled answers, intervals; eval_after pairs with eval_before problem
    by problem."""
    from kljax.train.trainer import train

    config = load_run_config(("configs/tiny.py"),
                             [*MESH, "--config.steps=2", "--config.rl.async_level=2", "--config.eval_examples=16"])
    summary = train(config, tmp_path / "run", progress=False)
    params, _, _, step = restore.restore_params(tmp_path / "run")
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(summary["params"]), jax.device_get(params))
    out = tmp_path / "eval.json"
    assert cli_main(["eval", "--checkpoint", str(tmp_path / "run"), "--json", str(out), *MESH,
                     "--no-progress"]) == 0
    assert "greedy" in capsys.readouterr().out
    result = json.loads(out.read_text())
    after = json.loads((tmp_path / "run" / "eval_after.json").read_text())
    assert result["step"] == 2
    for split, values in after.items():
        r = result["results"][f"repeat_digit:{split}"]
        assert r["n"] == values["n"] == 16
        assert r["greedy_accuracy"] == pytest.approx(values["accuracy"])
        assert r["greedy_reward"] == pytest.approx(values["reward"])  # partial credit: a sharp comparison
        assert r["domain"] == "in"
        assert r["greedy"] == values["greedy"] and r["sampled"] == values["sampled"]
        assert r["problems"] == values["problems"] and r["sampled"]["k"] == config.eval_samples == 2
        assert r["sampled"]["n"] == 16
        for kind in ("greedy", "sampled"):
            entry = values[kind]
            assert set(entry) >= {"accuracy", "ci95", "n"} and entry["ci95"][0] <= entry["accuracy"] <= entry["ci95"][1]
    before = json.loads((tmp_path / "run" / "eval_before.json").read_text())
    for split, values in after.items():
        assert values["problems"]["ids"] == before[split]["problems"]["ids"]  # the same problems, in order
        for kind in ("greedy", "sampled"):
            change = values["delta_vs_before"][kind]
            after_mean, before_mean = (float(np.mean(e["problems"][kind])) for e in (values, before[split]))
            assert change["diff"] == pytest.approx(after_mean - before_mean)
            assert change["ci95"][0] <= change["diff"] <= change["ci95"][1]


def test_eval_rows_per_call_bounded_by_the_kv_cache():
    """A run's evaluation samples EVAL_ROWS_PER_CALL rows per call (whole groups of 1 + samples) for a
    small model, fewer for a model whose KV cache would pass EVAL_CACHE_BYTES, and never fewer than
    the run's own rollout rows (whose cache the run holds anyway)."""
    from kljax.models.config import ModelConfig
    from kljax.models.known_configs import KNOWN_CONFIGS
    from kljax.sampling.step import cache_bytes
    from kljax.train import evaluate_loop as el

    small = ModelConfig.from_hf(KNOWN_CONFIGS["smollm2-135m"])
    assert el.rows_per_call(small, 16, 96, 4) == el.EVAL_ROWS_PER_CALL == 160
    assert el.rows_per_call(small, 16, 96, 2) == 159  # 53 groups of 3
    big = ModelConfig.from_hf(KNOWN_CONFIGS["qwen2.5-7b"], dtype="bfloat16")
    rows = el.rows_per_call(big, 0, 1536, 4)
    assert rows % 5 == 0 and 5 <= rows < 160 and cache_bytes(big, rows, 1536) <= el.EVAL_CACHE_BYTES
    assert el.rows_per_call(big, 320, 1536, 4) == 320
    plan = el.EvalPlan(splits=("test", "ood_ops"), n_examples=384, n_examples_ood=64, seed=0, samples=2,
                       temperature=0.8, max_prompt_len=64, max_new_tokens=32, rows_per_call=159, prompt_format="chat")
    assert [plan.size(s) for s in plan.splits] == [384, 64]
