"""`kljax train` on the exact-optimum toy task (kljax/tasks/toy_optimum.py): the logged exact metrics
against brute-force float64 sums, an unbiased run closing the gap, the tiny transformer's gap
identity, one trainer step equal to the convergence study's iteration, and the errors for settings
the task cannot run with."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.config import load_run_config
from kljax.config.load import CONFIGS_DIR
from kljax.errors import UserError
from kljax.policies.tabular import TabularPolicy, all_responses, sequence_probabilities
from kljax.tasks.from_config import task_of
from kljax.train.trainer import train

REPO_ROOT = CONFIGS_DIR.parent

TABULAR = REPO_ROOT / "configs" / "toy_tabular.py"
TRANSFORMER = REPO_ROOT / "configs" / "toy_transformer.py"


def _config(path: Path, *overrides: str):
    return load_run_config((path), [f"--config.{o}" for o in overrides])


def _rows(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _brute_force(params, ref_params, beta: float, vocab: int = 3, response_len: int = 3) -> dict[str, float]:
    """The exact metrics from first principles: pi(y|p) as products of the tabular rows, the reward
    tables rebuilt from their definitions, pi* = pi_ref exp(R / beta) / Z, all in float64."""
    policy = TabularPolicy(vocab, response_len, 3)
    responses, mask = all_responses(vocab, response_len, vocab - 1)
    lengths = mask.sum(1)
    pi = np.stack([np.asarray(sequence_probabilities(policy, params, p, responses, mask), np.float64)
                   for p in range(3)])
    ref = np.stack([np.asarray(sequence_probabilities(policy, ref_params, p, responses, mask), np.float64)
                    for p in range(3)])
    sparse = np.zeros(len(responses))
    sparse[np.argmin(np.where(lengths == response_len, ref[0], np.inf))] = 1.0
    surprisal = -np.log(ref[2])
    rewards = np.stack([sparse, lengths / response_len, (surprisal - surprisal.min()) / np.ptp(surprisal)])
    opt = ref * np.exp(rewards / beta)
    opt /= opt.sum(1, keepdims=True)
    kl_ref = np.sum(pi * np.log(pi / ref), 1)
    j = np.sum(pi * rewards, 1) - beta * kl_ref
    j_opt = np.sum(opt * rewards, 1) - beta * np.sum(opt * np.log(opt / ref), 1)
    return {"exact/gap": float(np.mean(beta * np.sum(pi * np.log(pi / opt), 1))), "exact/J": float(np.mean(j)),
            "exact/reward": float(np.mean(np.sum(pi * rewards, 1))), "exact/kl_seq": float(np.mean(kl_ref)),
            "exact/kl_opt": float(np.mean(np.sum(opt * np.log(opt / pi), 1))), "exact/J_opt": float(np.mean(j_opt))}


def test_task_responses_and_rewards_round_trip():
    task = task_of(_config(TABULAR))
    policy = task.tabular_policy()
    ref = policy.init_params(jax.random.PRNGKey(0))
    task.bind(policy, ref)
    assert len(task.response_texts) == len(set(task.response_texts)) == 15  # 1 + 2 + 4 + 8 over "a", "b", "."
    assert task.tokenizer.decode(task.tokenizer.encode("ab.")) == "ab."
    examples = task.examples("train", n=6)
    assert [ex.metadata["prompt"] for ex in examples] == [0, 1, 2, 0, 1, 2]
    for ex in examples[:3]:
        p = ex.metadata["prompt"]
        rewards = [task.check(ex, text).reward for text in task.response_texts]
        np.testing.assert_allclose(rewards, task.table.rewards_pn[p])
        assert task.check(ex, ex.answer).correct and ex.answer == task.best_response(p)
    with pytest.raises(ValueError, match="'abab' is not a response"):
        task.check(examples[0], "abab")


def test_tabular_run_logs_exact_metrics_and_closes_the_gap(tmp_path):
    workdir = tmp_path / "run"
    summary = train(_config(TABULAR, "steps=40", "checkpoint_every=40", "optim.schedule=constant"), workdir,
                    progress=False)
    ref = TabularPolicy(3, 3, 3).init_params(jax.random.PRNGKey(0))  # the run's pi_ref: its start (seed 0)
    before = json.loads((workdir / "exact_before.json").read_text())
    rows = _rows(workdir)
    assert len(rows) == 40 and all("exact/gap" in r for r in rows)
    for got, want in ((before, _brute_force(ref, ref, 0.1)), (rows[-1], _brute_force(summary["params"], ref, 0.1))):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=2e-4, abs=1e-6), key
    assert before["exact/kl_seq"] == pytest.approx(0.0, abs=1e-7)
    # k1 in the reward (the default) is unbiased: 40 steps take it most of the way to pi*
    assert rows[-1]["exact/gap"] < 0.5 * before["exact/gap"]
    assert summary["exact"]["before"] == pytest.approx(before["exact/gap"])
    assert summary["exact"]["after"] == pytest.approx(rows[-1]["exact/gap"], rel=1e-6)


def test_exact_metrics_are_those_of_the_tempered_policy(tmp_path):
    """At rl.temperature T the policy trained is softmax(logits / T), pi_ref likewise (#38): the task's
    rewards, pi* and exact metrics are those of the tabular policy with logits / T (brute force).
    Failed before: the metrics were computed at temperature 1 whatever rl.temperature was."""
    temperature = 0.5
    workdir = tmp_path / "run"
    summary = train(_config(TABULAR, "steps=2", "checkpoint_every=2", f"rl.temperature={temperature}"), workdir,
                    progress=False)
    ref = TabularPolicy(3, 3, 3).init_params(jax.random.PRNGKey(0))
    tempered = jax.tree.map(lambda x: x / temperature, (ref, summary["params"]))
    before = json.loads((workdir / "exact_before.json").read_text())
    for got, want in ((before, _brute_force(tempered[0], tempered[0], 0.1)),
                      (_rows(workdir)[-1], _brute_force(tempered[1], tempered[0], 0.1))):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=2e-4, abs=1e-6), key
    at_one = _brute_force(ref, ref, 0.1)["exact/gap"]  # what temperature 1 gives: a different number
    assert abs(before["exact/gap"] - at_one) > 0.01 * at_one


def test_one_trainer_step_is_the_convergence_study_iteration(tmp_path):
    """The study's loop (kljax/studies/converge.py) and `kljax train` take the same update: same
    samples for the same key, same parameters after it (the trainer takes log pi from the sampler,
    the study re-scores: equal to float rounding)."""
    from kljax.studies.converge import RunSettings, make_iteration
    from kljax.tasks.exact_optimum import make_task
    from kljax.train.state import TrainState

    summary = train(_config(TABULAR, "steps=1", "checkpoint_every=1"), tmp_path / "run", progress=False)
    task = make_task(seed=0)  # the same tabular pi_ref (PRNGKey(0), scale 1) and reward tables
    kl = load_run_config(TABULAR).kl
    run = RunSettings(steps=1, group_size=8, learning_rate=0.1, end_lr_fraction=0.05)
    iteration, tx = make_iteration(task, kl, run)
    ref = task.ref_params
    state = TrainState(ref, tx.init(ref), jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.uint32))
    key = jax.random.fold_in(jax.random.PRNGKey(0), 0)  # the trainer's key of step 0
    (state, _), metrics = iteration((state, ref), (key, jnp.float32(0.1)))
    moved = np.max(np.abs(np.asarray(summary["params"]["logits"]) - np.asarray(ref["logits"])))
    assert moved > 1e-3
    np.testing.assert_allclose(np.asarray(summary["params"]["logits"]), np.asarray(state.params["logits"]),
                               atol=1e-5)
    row = _rows(tmp_path / "run")[0]
    assert row["exact/gap"] == pytest.approx(float(metrics["gap"]), rel=1e-4)


def test_stale_sampler_run_resumed_equals_uninterrupted(tmp_path):
    """rl.async_level with the tabular policy: its snapshot queue is checkpointed and restored, so a
    run stopped after 3 steps and resumed logs the same exact gaps as one that never stopped."""
    config = _config(TABULAR, "steps=6", "checkpoint_every=3", "rl.async_level=2")
    whole = train(config, tmp_path / "whole", progress=False)
    assert train(config, tmp_path / "parts", progress=False, stop_after=3)["stopped_at"] == 3
    parts = train(config, tmp_path / "parts", resume=True, progress=False)
    np.testing.assert_array_equal(np.asarray(whole["params"]["logits"]), np.asarray(parts["params"]["logits"]))
    gaps = [[r["exact/gap"] for r in _rows(tmp_path / name)] for name in ("whole", "parts")]
    assert gaps[0] == gaps[1] and len(gaps[0]) == 6


def test_tiny_transformer_run_logs_the_gap_identity(tmp_path):
    # 8 simulated devices: 12 prompts (each shape 4 times) over data=4, the 4 heads (2 KV heads) over tensor=2
    config = _config(TRANSFORMER, "steps=3", "checkpoint_every=3", "mesh.data=4", "mesh.tensor=2",
                     "rl.prompts_per_step=12")
    train(config, tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    before = json.loads((tmp_path / "run" / "exact_before.json").read_text())
    assert before["exact/kl_seq"] == pytest.approx(0.0, abs=1e-6) and before["exact/gap"] > 0.05
    for r in [before, *rows]:  # J(pi*) - J(pi) = beta KL(pi || pi*) for every pi
        assert r["exact/J_opt"] - r["exact/J"] == pytest.approx(r["exact/gap"], abs=2e-5)
        assert r["exact/kl_opt"] > 0 and np.isfinite(r["exact/reward"])
    assert rows[-1]["exact/gap"] != before["exact/gap"]


@pytest.mark.parametrize(("path", "overrides", "message"), [
    (TABULAR, ("rl.max_new_tokens=4",), "rl.max_new_tokens=4 must equal config.task.toy.response_len=3"),
    (TABULAR, ("task.prompt_format=chat",), "needs 'raw'"),
    (TABULAR, ("task.name=repeat_digit", "task.eval_splits=test"), "source='tabular' needs a task that enumerates"),
    (TABULAR, ("model.source=default",), "must be one of \\['tabular', 'tiny'\\]"),
    (TABULAR, ("task.toy.shapes=sparse,wide",), "\\['wide'\\] not valid"),
    (TRANSFORMER, ("task.toy.shapes=sparse,long,conflict,long",), "4 shapes need a vocabulary"),
])
def test_settings_the_task_cannot_run_with_are_named(tmp_path, path, overrides, message):
    with pytest.raises((ValueError, UserError), match=message):
        train(_config(path, *overrides), tmp_path / "run", progress=False)


def test_commands_for_text_runs_name_the_toy_run(tmp_path, capsys):
    """eval/generate --checkpoint and export refuse a toy run with one line pointing to its exact
    metrics, and eval --tasks refuses the toy task (its rewards are relative to a run's pi_ref)."""
    from kljax.cli import main

    workdir = tmp_path / "run"
    train(_config(TABULAR, "steps=1", "checkpoint_every=1"), workdir, progress=False)
    capsys.readouterr()
    for argv in (["eval", "--checkpoint", str(workdir)], ["generate", "--checkpoint", str(workdir), "--prompt", "a"],
                 ["export", str(workdir), "--out", str(tmp_path / "hf")],
                 ["eval", "--model", "tiny", "--tasks", "toy_optimum:train"]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"kljax {argv[0]}: error: ") and "exact/gap" in err, err
    assert not (tmp_path / "hf").exists()
