"""TRL's GRPOTrainer metric names and definitions (`kljax.train.trl_metrics`): each metric against a
numpy computation of TRL 1.16's formula on fixed batches (NaN scores, zero-std groups, truncated
completions, clip regions), the train step's kl and clip_ratio/* at its own forward (micro-batched
equal to one batch), and the rows a tiny run writes."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kljax.config import load_run_config
from kljax.config.sections import OptimConfig
from kljax.models import transformer as tfm
from kljax.parallel import sharding as shd
from kljax.rl.kl import KLConfig
from kljax.tasks.registry import get_task
from kljax.train import run_logs, tracking
from kljax.train import state as st
from kljax.train import trl_metrics as tm
from kljax.train.metrics import read_jsonl
from kljax.train.reward_set import RewardSet
from kljax.train.run_build import build
from kljax.train.step import StepSettings, train_step
from kljax.train.trainer import iteration, train
from tests.test_train_step import MODEL, make_batch, reference_params

MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def tiny(**overrides):
    overrides = {**MESH, **overrides}
    return load_run_config("configs/tiny.py", [f"--config.{k}={v}" for k, v in overrides.items()])


def trl_nanstd(x):
    """TRL's trl.trainer.utils.nanstd, written out: nanmean of squared deviations times n / (n - 1)."""
    x = np.asarray(x, np.float64)
    ok = ~np.isnan(x)
    n = ok.sum()
    if n < 2:
        return math.nan
    mean = x[ok].mean()
    return math.sqrt(np.mean((x[ok] - mean) ** 2) * n / (n - 1))


# ------------------------------------------------------------------------------------------- pure


def test_reward_metrics_std_over_the_batch_and_zero_std_groups():
    rewards = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.5], np.float32)  # 3 groups of 3
    out = tm.reward_metrics(rewards, 3)
    assert out["reward"] == pytest.approx(rewards.astype(np.float64).mean())
    assert out["reward_std"] == pytest.approx(trl_nanstd(rewards))  # one std of all 9, n - 1
    assert out["reward_std"] != pytest.approx(np.mean([trl_nanstd(g) for g in rewards.reshape(3, 3)]))
    assert out["frac_reward_zero_std"] == pytest.approx(1 / 3)  # only the first group is all equal
    assert tm.reward_metrics(np.array([0.5, 0.5, 0.5, 0.5]), 2)["frac_reward_zero_std"] == 1.0
    assert tm.reward_metrics(np.array([0.0, 1.0]), 1)["frac_reward_zero_std"] == 1.0  # TRL: std 0 when G = 1
    assert math.isnan(tm.reward_metrics(np.array([3.0]), 1)["reward_std"])


def test_function_metrics_leave_out_nan_scores():
    out = tm.function_metrics("fmt", [1.0, np.nan, 3.0, np.nan, 5.0])
    assert out == {"rewards/fmt/mean": pytest.approx(3.0), "rewards/fmt/std": pytest.approx(2.0)}
    assert out["rewards/fmt/std"] == pytest.approx(trl_nanstd([1.0, np.nan, 3.0, np.nan, 5.0]))
    one, none = tm.function_metrics("a", [np.nan, 2.0]), tm.function_metrics("a", [np.nan, np.nan])
    assert one["rewards/a/mean"] == 2.0 and math.isnan(one["rewards/a/std"])
    assert all(math.isnan(v) for v in none.values())


def test_completion_metrics_of_truncated_and_terminated():
    lengths, stopped = np.array([3, 6, 6, 2]), np.array([True, False, True, True])
    out = tm.completion_metrics(lengths, stopped)
    assert out == {
        "completions/mean_length": pytest.approx(17 / 4), "completions/min_length": 2.0,
        "completions/max_length": 6.0, "completions/clipped_ratio": 0.25,
        "completions/mean_terminated_length": pytest.approx(11 / 3), "completions/min_terminated_length": 2.0,
        "completions/max_terminated_length": 6.0,
    }
    cut = tm.completion_metrics(np.array([6, 6]), np.array([False, False]))
    assert cut["completions/clipped_ratio"] == 1.0 and cut["completions/mean_terminated_length"] == 0.0
    assert cut["completions/min_terminated_length"] == cut["completions/max_terminated_length"] == 0.0


def numpy_step_metrics(logp, sampler, ref, adv, mask, low, high):
    """TRL's compute_loss metrics, written with numpy (token-level importance sampling)."""
    on = mask > 0
    coef = np.exp(logp - sampler)
    per_token_kl = np.exp(ref - logp) - (ref - logp) - 1
    is_low = (coef < 1 - low) & (adv < 0)
    is_high = (coef > 1 + high) & (adv > 0)
    n = max(on.sum(), 1)
    with np.errstate(invalid="ignore"):
        low_seq = (is_low * on).sum(1) / on.sum(1)
        high_seq = (is_high * on).sum(1) / on.sum(1)
    return {"kl": (per_token_kl * on).sum() / n, "clip_ratio/low_mean": (is_low * on).sum() / n,
            "clip_ratio/high_mean": (is_high * on).sum() / n,
            "clip_ratio/region_mean": ((is_low | is_high) * on).sum() / n,
            "clip_ratio/low_min": np.nanmin(low_seq), "clip_ratio/high_max": np.nanmax(high_seq)}


def fixed_token_batch():
    """[4, 5]: ratios 0.6 / 1 / 1.65 against advantages of both signs, a sequence without tokens."""
    logp = np.log(np.array([[0.5, 0.2, 0.9, 0.3, 0.4], [0.1, 0.6, 0.6, 0.7, 0.2],
                            [0.3, 0.3, 0.8, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2, 0.2]]))
    shift = np.array([[0.5, 0.0, -0.5, 0.5, 0.0], [-0.5, -0.5, 0.5, 0.0, 0.0],
                      [0.0, 0.5, 0.5, -0.5, 0.0], [0.5, 0.5, 0.5, 0.5, 0.5]])
    ref = logp + np.array([[0.3, -0.2, 0.1, 0.0, 0.4], [0.0, 0.7, -0.4, 0.2, 0.1],
                           [-0.1, 0.1, 0.2, 0.3, 0.0], [0.1, 0.1, 0.1, 0.1, 0.1]])
    adv = np.array([[-1.0], [1.0], [0.5], [-0.3]]) * np.ones((1, 5))
    adv[2, 3] = -0.5  # a per-token advantage of the other sign
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.float32)
    return logp, logp + shift, ref, adv, mask  # sampler = logp + shift: ratio exp(-shift)


@pytest.mark.parametrize("low, high", [(0.2, None), (0.2, 0.28), (0.3, 0.7)])
def test_step_sums_match_trls_formulas(low, high):
    logp, sampler, ref, adv, mask = fixed_token_batch()
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    sums = tm.step_sums(f32(logp), f32(sampler), f32(ref), f32(adv), f32(mask), low, high)
    got = {k: float(v) for k, v in tm.step_means(sums, f32(mask)).items()}
    want = numpy_step_metrics(logp, sampler, ref, adv, mask, low, low if high is None else high)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    if (low, high) == (0.2, None):
        assert 0 < got["clip_ratio/low_mean"] and 0 < got["clip_ratio/high_mean"] and got["clip_ratio/high_max"] > 0
    # micro-batches: sums add, min / max combine: rows {0, 2} and {1, 3} give the whole batch's
    parts = [tm.step_sums(*(f32(x[i::2]) for x in (logp, sampler, ref, adv)), f32(mask[i::2]), low, high)
             for i in range(2)]
    combined = {k: (min if k.endswith("_min") else max if k.endswith("_max") else sum)(float(p[k]) for p in parts)
                for k in tm.STEP_SUMS_INIT}
    for k, v in combined.items():
        assert v == pytest.approx(float(sums[k]), rel=1e-6), k


def test_step_sums_without_clipping_or_tokens():
    logp, sampler, ref, adv, mask = (jnp.asarray(x, jnp.float32) for x in fixed_token_batch())
    got = tm.step_means(tm.step_sums(logp, sampler, ref, adv, mask, None, None), mask)
    assert float(got["clip_ratio/region_mean"]) == 0.0 and float(got["clip_ratio/low_min"]) == 0.0
    empty = jnp.zeros_like(mask)
    got = tm.step_means(tm.step_sums(logp, sampler, ref, adv, empty, 0.2, None), empty)
    assert float(got["kl"]) == 0.0 and math.isnan(float(got["clip_ratio/low_min"]))
    assert math.isnan(float(got["clip_ratio/high_max"]))


def test_train_step_reports_trl_kl_and_clip_ratios_at_its_forward():
    """Off-policy (sampler log-probs shifted by +-0.5): the step's kl and clip_ratio/* are TRL's formulas
    of the step's own log-probs; 2 micro-batches give the same; region_mean is kljax's clip_fraction."""
    kl = KLConfig("k3", "loss", beta=0.1)
    mesh = shd.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    tx = optax.sgd(0.0)
    p_sh = st.param_shardings(MODEL, mesh)
    init = lambda: st.create_state(lambda: tfm.init_params(MODEL, jax.random.PRNGKey(0), std=0.3), tx, p_sh, mesh, 0)
    state, _ = init()
    params = jax.device_get(state.params)
    batch, _ = make_batch(params, kl)
    logp = np.asarray(batch.sampler_logp_br)  # the step's forward gives these again (same params)
    shift = 0.5 * np.where(np.arange(logp.size).reshape(logp.shape) % 3 == 0, 1.0,
                           np.where(np.arange(logp.size).reshape(logp.shape) % 3 == 1, -1.0, 0.0))
    batch = dataclasses.replace(batch, sampler_logp_br=jnp.asarray(logp + shift, jnp.float32))
    want = numpy_step_metrics(logp, logp + shift, np.asarray(batch.ref_logp_br), np.asarray(batch.advantages_br),
                              np.asarray(batch.response_mask_br), 0.2, 0.28)
    for micro in (1, 2):
        settings = StepSettings(MODEL, kl, clip_low=0.2, clip_high=0.28, micro_batches=micro)
        state, _ = init()
        step = jax.jit(functools.partial(train_step, settings=settings, tx=tx))
        _, metrics = step(state, batch, jax.device_put(reference_params(params), p_sh))
        for k in want:
            assert float(metrics[k]) == pytest.approx(want[k], rel=1e-4, abs=1e-6), (micro, k)
        assert float(metrics["clip_ratio/region_mean"]) == pytest.approx(float(metrics["clip_fraction"]))
    assert want["clip_ratio/region_mean"] > 0


def test_last_learning_rate_is_the_schedule_at_the_updates_applied_before():
    c = OptimConfig(learning_rate=1e-2, warmup_steps=4)
    tx = st.make_optimizer(c)
    params = {"w": jnp.ones(3)}
    opt = tx.init(params)
    schedule = st.learning_rate_schedule(c)
    for k in range(1, 4):
        _, opt = tx.update({"w": jnp.ones(3)}, opt, params)
        assert st.last_learning_rate(c, opt) == pytest.approx(float(schedule(k - 1)))
        assert st.last_learning_rate(c, opt, skipped=True) == pytest.approx(float(schedule(k)))
    assert st.last_learning_rate(c, opt) == pytest.approx(1e-2 * 2 / 4)


def test_resumed_num_tokens_from_meta_else_the_row_of_that_step():
    rows = [{"step": 1, "num_tokens": 10.0}, {"step": 2, "num_tokens": 25.0}, {"step": 3}]
    assert tm.resumed_num_tokens({"num_tokens": 40}, rows, 2) == 40.0
    assert tm.resumed_num_tokens({"step": 2}, rows, 2) == 25.0
    assert math.isnan(tm.resumed_num_tokens({"num_tokens": None}, rows, 3))


def test_reward_set_names_and_log_metric():
    task = get_task("repeat_digit")
    examples = task.examples("train", n=4, seed=0)

    def fmt(completions, log_metric, **kw):
        log_metric("my_metric", 2.0)
        log_metric("my_metric", 4.0)
        log_metric("rewards/fmt/mean", -1.0)  # a name the set writes itself: the set's value stays
        return [None if c == "x" else float(len(c)) for c in completions]

    def one(completions, **kw):
        return [1.0] * len(completions)

    rewards = RewardSet.build(task, load_run_config("configs/tiny.py", []).reward, [fmt, one], columns=["answer"])
    result = rewards(examples, ["ab", "x", "abcd", "x"], [[1], [2], [3], [4]])
    m = result.metrics
    assert m["rewards/fmt/mean"] == pytest.approx(3.0) and m["rewards/fmt/std"] == pytest.approx(trl_nanstd([2, 4]))
    assert m["rewards/one/mean"] == 1.0 and m["rewards/one/std"] == 0.0 and m["my_metric"] == 3.0
    assert not any(k.startswith("reward/") for k in m)


def test_names_in_logs_mlflow_and_the_step_line():
    assert tracking._mlflow_key("rewards/my fn/mean") == "rewards/my fn/mean"
    assert tracking._mlflow_key("eval/test/rewards/f(x)/mean") == "eval/test/rewards/f_x_/mean"
    results = {"test": {"accuracy": 0.5, "reward": 1.0, "rewards": {"fmt": 0.25}}}
    assert run_logs.eval_metrics(results) == {"eval/test/accuracy": 0.5, "eval/test/reward": 1.0,
                                              "eval/test/rewards/fmt/mean": 0.25}
    line = run_logs.step_line(3, 10, {"reward": 1.0, "rewards/fmt/mean": 0.5, "rewards/fmt/std": 0.1,
                                      "rewards/fmt/errors": 0.0})
    assert "rewards/fmt/mean=0.5" in line and "std" not in line and "errors" not in line
    assert tm.trl_kl_logged(0.04, "loss") and not tm.trl_kl_logged(0.0, "loss")
    assert not tm.trl_kl_logged(0.1, "none")


# ------------------------------------------------------------------------------------ end to end


def digits(completions, **kw):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def even_only(completions, **kw):  # no score (None) for odd-length completions
    return [float(len(c)) if len(c) % 2 == 0 else None for c in completions]


def test_iteration_rows_are_trls_definitions_of_its_batch():
    """Two iterations of the tiny run (truncated responses left out of the loss, a cosine schedule):
    every TRL metric of the row against numpy on the iteration's own batch and rollout."""
    config = tiny(**{"rl.max_new_tokens": 4, "rl.mask_truncated": True, "optim.schedule": "cosine"})
    run, state, ref_params = build(config, [digits, even_only])
    g, beta = config.rl.group_size, float(config.kl.beta)
    schedule = st.learning_rate_schedule(config.run_optim)
    seen_truncated = False
    for step in range(2):
        it = iteration(run, state, ref_params, step, beta=beta)
        state, beta, row, batch, info = it.state, it.beta, it.row, it.batch, it.info
        rewards = np.asarray(info.rewards, np.float64)
        assert row["reward"] == pytest.approx(rewards.mean())
        assert row["reward_std"] == pytest.approx(trl_nanstd(rewards))
        zero = [trl_nanstd(grp) <= 1e-8 for grp in rewards.reshape(-1, g)]
        assert row["frac_reward_zero_std"] == pytest.approx(np.mean(zero))
        for name, scores in info.reward_parts.items():
            assert row[f"rewards/{name}/mean"] == pytest.approx(np.nanmean(scores), nan_ok=True)
            assert row[f"rewards/{name}/std"] == pytest.approx(trl_nanstd(scores), nan_ok=True)
        assert np.isnan(info.reward_parts["even_only"]).any() or step  # some None scores in the data
        mask_bs = np.asarray(batch.mask_bs)
        r = batch.response_mask_br.shape[1]
        lengths = mask_bs[:, -r:].sum(1)
        stopped = np.asarray(info.stopped)
        seen_truncated |= bool((~stopped).any())
        assert row["completions/mean_length"] == pytest.approx(lengths.mean())
        assert row["completions/clipped_ratio"] == pytest.approx(np.mean(~stopped))
        ended = lengths[stopped] if stopped.any() else np.zeros(1)
        assert row["completions/max_terminated_length"] == ended.max()
        assert row["completions/mean_terminated_length"] == pytest.approx(ended.mean())
        loss_mask = np.asarray(batch.response_mask_br)
        np.testing.assert_array_equal(loss_mask.sum(1), np.where(stopped, lengths, 0))  # mask_truncated
        assert it.tokens == int(mask_bs.sum())  # prompt + completion tokens of the step
        logp, ref = np.asarray(info.scored["logp"], np.float64), np.asarray(batch.ref_logp_br, np.float64)
        k3 = np.exp(ref - logp) - (ref - logp) - 1
        assert row["kl"] == pytest.approx((k3 * loss_mask).sum() / max(loss_mask.sum(), 1), rel=1e-4, abs=1e-7)
        assert row["kl"] == pytest.approx(row["k3"], rel=1e-4, abs=1e-7)  # one update: kljax's k3 is TRL's kl
        entropy = np.asarray(info.scored["entropy"], np.float64)
        assert row["entropy"] == pytest.approx((entropy * loss_mask).sum() / max(loss_mask.sum(), 1), rel=1e-5)
        assert row["clip_ratio/region_mean"] == 0.0  # on-policy: ratio 1
        assert row["learning_rate"] == pytest.approx(float(schedule(step)))
        assert row["epoch"] == 0.0  # a generated task has no rows to pass over (as trainer_state)
    assert seen_truncated, "no response was cut at rl.max_new_tokens: the test checks nothing of clipped_ratio"


def test_train_rows_carry_trl_names(tmp_path):
    train(tiny(steps=2, checkpoint_every=100), tmp_path, progress=False, functions=[digits, even_only])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    want = {"reward", "reward_std", "frac_reward_zero_std", "rewards/digits/mean", "rewards/digits/std",
            "rewards/even_only/mean", "rewards/even_only/std", "completions/mean_length",
            "completions/min_length", "completions/max_length", "completions/clipped_ratio",
            "completions/mean_terminated_length", "completions/min_terminated_length",
            "completions/max_terminated_length", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/low_min",
            "clip_ratio/high_mean", "clip_ratio/high_max", "clip_ratio/region_mean", "num_tokens",
            "learning_rate", "epoch",
            "kl_seq", "k1", "k2", "k3", "response_length", "clip_fraction", "loss", "grad_norm", "accuracy"}
    for row in rows:
        assert want <= set(row), want - set(row)
        assert not any(k.startswith("reward/") for k in row)
        names = set(row)  # an MLflow file store cannot hold both "a" and "a/b"
        assert not [k for k in names if any(other.startswith(k + "/") for other in names)]
    assert 0 < rows[0]["num_tokens"] < rows[1]["num_tokens"]
    assert rows[1]["learning_rate"] == pytest.approx(5e-3)
