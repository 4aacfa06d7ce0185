"""`trainer.iteration`, the loop body `kljax train` and `kljax bench rl` share: the loop is exactly
repeated iterations, the run holds two copies of the weights (trained and frozen reference), and
the logged score time includes the scoring itself."""

from __future__ import annotations

import gc
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.config import load_run_config
from kljax.rl import advantages as adv
from kljax.train.metrics import deterministic, read_jsonl
from kljax.train.run_build import build
from kljax.train.trainer import iteration, train

# The tiny config sharded over the 8 simulated devices: fsdp=4 x tensor=2.
MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def tiny(**overrides):
    overrides = {**MESH, **overrides}
    return load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in overrides.items()])


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def buffers(tree) -> set[int]:
    return {s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree) for s in x.addressable_shards}


@pytest.mark.parametrize("overrides", [{}, {"rl.async_level": 1, "rl.updates_per_batch": 2}])
def test_train_is_build_then_repeated_iterations(tmp_path, overrides):
    config = tiny(steps=3, checkpoint_every=100, **overrides)
    summary = train(config, tmp_path, progress=False)
    settings = config
    run, state, ref_params = build(settings)
    snapshots, beta, rows = [ref_params] * settings.rl.async_level, float(settings.kl.beta), []
    num_tokens = 0
    for step in range(settings.steps):
        it = iteration(run, state, ref_params, step, beta=beta, snapshots=snapshots)
        state, snapshots, beta = it.state, it.snapshots, it.beta
        num_tokens += it.tokens  # the loop adds TRL's num_tokens, the tokens of every step so far
        rows.append({"step": step + 1, **it.row, "num_tokens": num_tokens})
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(summary["params"]), jax.device_get(state.params))
    logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert [deterministic(r) for r in logged] == [deterministic(r) for r in rows]
    assert [set(r) for r in logged] == [set(r) for r in rows]


def test_build_holds_two_copies_of_the_weights_and_the_reference_stays_frozen():
    gc.collect()
    before = {id(x): x for x in jax.live_arrays()}  # held, so their ids cannot be reused
    run, state, ref_params = build(tiny())
    new = [x for x in jax.live_arrays() if id(x) not in before]
    params = nbytes(state.params)
    # The state (params + Adam moments) and one frozen reference copy; no third copy of the weights.
    assert sum(x.nbytes for x in new) < nbytes(state) + params + params // 2
    assert run.policy.params is None
    assert not buffers(ref_params) & buffers(state.params)  # the train step donates the state's buffers
    frozen = jax.device_get(ref_params)
    initial = jax.device_get(state.params)
    for step in range(3):
        state = iteration(run, state, ref_params, step, beta=float(run.config.kl.beta)).state
    jax.tree.map(np.testing.assert_array_equal, frozen, jax.device_get(ref_params))
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), initial, jax.device_get(state.params)))
    assert any(moved)


def test_bfloat16_compute_keeps_the_reference_in_bfloat16_with_the_same_iterations():
    """With bfloat16 compute over float32 params the frozen reference is held in bfloat16 (half its
    bytes), and iterations equal those scored against the float32 reference exactly."""
    bf16 = {"model.dtype": "bfloat16", "model.scan_layers": False, "kl.estimator": "k3", "kl.placement": "loss"}
    settings = tiny(**bf16)
    run, state, ref_params = build(settings)
    _, state32, _ = build(settings)
    ref32 = jax.tree.map(jnp.copy, state32.params)  # the initial weights in float32
    assert {x.dtype for x in jax.tree.leaves(ref_params)} == {jnp.dtype(jnp.bfloat16)}
    assert 2 * nbytes(ref_params) == nbytes(ref32)
    beta, beta32 = float(settings.kl.beta), float(settings.kl.beta)
    for step in range(2):
        it, it32 = (iteration(run, state, ref_params, step, beta=beta),
                    iteration(run, state32, ref32, step, beta=beta32))
        assert deterministic(it.row) == deterministic(it32.row)
        np.testing.assert_array_equal(np.asarray(it.batch.ref_logp_br), np.asarray(it32.batch.ref_logp_br))
        state, state32, beta, beta32 = it.state, it32.state, it.beta, it32.beta
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), jax.device_get(state32.params))


def test_score_time_includes_the_asynchronous_scoring(monkeypatch):
    """Advantages (the last result of the score phase) that are ready DELAY seconds after their
    dispatch returns are timed as score, not as update (where the train step would wait for them)."""
    delay = 0.5
    run, state, ref_params = build(tiny())
    beta = float(run.config.kl.beta)
    state = iteration(run, state, ref_params, 0, beta=beta).state  # compiles

    def sleep_then_zero():
        time.sleep(delay)
        return np.float32(0)

    late = jax.jit(lambda x: x + jax.pure_callback(sleep_then_zero, jax.ShapeDtypeStruct((), jnp.float32)))
    token_advantages = adv.token_advantages
    monkeypatch.setattr(adv, "token_advantages", lambda *a, **k: late(token_advantages(*a, **k)))
    late(jnp.zeros(()))  # compiles (and sleeps) before the timed iteration
    row = iteration(run, state, ref_params, 1, beta=beta).row
    assert row["time_score"] >= delay, row
    assert row["time_update"] < delay, row


@pytest.mark.parametrize("rl, kl, reused", [
    ({}, {}, True),
    ({"temperature": 0.0}, {}, True),  # greedy: the sampler reports pi's own log-probs
    ({"reuse_sampler_logprobs": False}, {}, False),
    ({"async_level": 1}, {}, False),  # stale sampler parameters
    ({"temperature": 0.7}, {}, True),  # the policy trained is the tempered one: the sampler draws from it
    ({"top_k": 5}, {}, False),
    ({"top_p": 0.9}, {}, False),
    ({}, {"estimator": "full", "placement": "loss"}, False),  # needs the policy's hidden states
    ({"dtype": "bfloat16"}, {}, False),  # 16-bit sampler and teacher-forced log-probs round differently
])
def test_sampler_is_policy_only_when_the_sampler_draws_from_pi(rl, kl, reused):
    from kljax.train.policy import tiny_model_config
    from kljax.train.rollout import sampler_is_policy

    dtype = rl.get("dtype", "float32")
    settings = (tiny(**{f"rl.{k}": v for k, v in rl.items() if k != "dtype"},
                             **{f"kl.{k}": v for k, v in kl.items()}, **{"model.dtype": dtype}))
    model = tiny_model_config(settings.model, settings.model.tiny.vocab_size)
    assert model.dtype == dtype
    assert sampler_is_policy(settings.rl, settings.kl, model) is reused


@pytest.mark.parametrize("kl", [{"kl.estimator": "k1", "kl.placement": "reward"},
                                {"kl.estimator": "k3", "kl.placement": "both"},
                                {"kl.estimator": "k1", "kl.placement": "reward", "rl.temperature": 0.7}])
def test_reusing_the_samplers_logprobs_equals_rescoring(kl):
    """On-policy, the iteration that takes log pi and the entropy from the sampler (no policy forward
    in scoring: its score function returns the reference's log-probs only) logs the same KL and
    entropy metrics, builds the same advantages and makes the same update as the one that re-scores."""
    results = {}
    for reuse in (True, False):
        run, state, ref_params = build(tiny(**kl, **{"rl.reuse_sampler_logprobs": reuse}))
        beta, rows = float(run.config.kl.beta), []
        for step in range(2):
            it = iteration(run, state, ref_params, step, beta=beta)
            state, beta = it.state, it.beta
            rows.append(it.row)
        scored = run.score_fn(state.params, ref_params, it.batch)
        assert ("logp" in scored) is not reuse
        results[reuse] = rows, jax.device_get(it.batch), jax.device_get(state.params)
    (rows, batch, params), (rows_rescored, batch_rescored, params_rescored) = results[True], results[False]
    for row, want in zip(rows, rows_rescored, strict=True):
        for key in ("kl_seq", "k1", "k2", "k3", "entropy", "reward", "loss", "pg_loss", "kl_loss", "grad_norm"):
            np.testing.assert_allclose(row[key], want[key], atol=1e-5, rtol=1e-4, err_msg=key)
    np.testing.assert_allclose(batch.advantages_br, batch_rescored.advantages_br, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, params_rescored)


@pytest.mark.parametrize("overrides, in_update", [
    ({}, False),  # float32, temperature 1: the sampler's log-probs are pi's
    ({"model.dtype": "bfloat16"}, True),  # 16-bit: no reuse, and nothing before the update needs log pi
    ({"rl.reuse_sampler_logprobs": False}, True),
    ({"rl.temperature": 0.7}, False),  # the tempered sampler is the policy: its log-probs are reused
    ({"rl.top_p": 0.9}, True),
    ({"model.dtype": "bfloat16", "kl.placement": "reward", "kl.estimator": "k1"}, False),  # the penalty needs it
    ({"model.dtype": "bfloat16", "kl.placement": "both"}, False),
    ({"model.dtype": "bfloat16", "rl.updates_per_batch": 2}, False),  # later updates run at moved params
    ({"model.dtype": "bfloat16", "kl.estimator": "full"}, False),
])
def test_policy_scored_in_update_only_when_nothing_needs_log_pi_before_the_update(overrides, in_update):
    from kljax.train.policy import tiny_model_config
    from kljax.train.rollout import policy_scored_in_update

    settings = tiny(**{"kl.estimator": "k3", "kl.placement": "loss", **overrides})
    model = tiny_model_config(settings.model, settings.model.tiny.vocab_size)
    assert policy_scored_in_update(settings.rl, settings.kl, model) is in_update


def test_metrics_from_the_update_equal_those_of_a_policy_scoring_pass(monkeypatch):
    """Without the policy's scoring forward (`policy_scored_in_update`: its score function returns
    the reference's log-probs only) the update's own forward reports the KL metrics and entropy:
    the same rows, advantages and update as the iteration that scores the policy first."""
    from kljax.train import run_build

    config = tiny(**{"kl.estimator": "k3", "kl.placement": "loss", "kl.beta": 0.5, "rl.micro_batches": 2,
                     "rl.reuse_sampler_logprobs": False})
    results = {}
    for in_update in (True, False):
        if not in_update:
            monkeypatch.setattr(run_build, "policy_scored_in_update", lambda *a: False)
        run, state, ref_params = build(config)
        beta, rows = float(run.config.kl.beta), []
        for step in range(2):
            it = iteration(run, state, ref_params, step, beta=beta)
            state, beta = it.state, it.beta
            rows.append(it.row)
        assert ("logp" in it.info.scored) is not in_update
        results[in_update] = rows, jax.device_get(it.batch), jax.device_get(state.params)
    (rows, batch, params), (rows_scored, batch_scored, params_scored) = results[True], results[False]
    assert rows[0]["kl_seq"] == 0.0 and rows[1]["kl_seq"] != 0.0  # the first update moved the policy
    for row, want in zip(rows, rows_scored, strict=True):
        assert set(row) == set(want)
        for key in ("kl_seq", "k1", "k2", "k3", "entropy", "response_length", "reward", "loss", "pg_loss",
                    "kl_loss", "grad_norm", "ratio_mean"):
            np.testing.assert_allclose(row[key], want[key], atol=1e-6, rtol=1e-5, err_msg=key)
    np.testing.assert_array_equal(batch.advantages_br, batch_scored.advantages_br)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params, params_scored)
