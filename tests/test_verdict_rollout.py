"""The verdict `kljax train` prints for the shipped default run is what its real rollout and train
step do, sampler included.

Every batch of one group of G responses is enumerated on a tabular policy (vocabulary 2, token 1
stops, responses of 1-2 tokens) and driven through the real `rollout` (the sampler's own float32
log-probs, reused as the policy's when the sampler draws from it; the reference scored as the
trainer does) and two `train_step`s on the same batch (SGD, lr 1: the update is the gradient). The
settings are configs/default.py's (temperature 0.8, top-p 1, rloo, G = 4, k1 in the reward, beta
0.05, clip 0.2, seq-mean-token-sum-norm) with only the buffer sizes shrunk to the toy's. The
reference is computed here, independently, in float64: the sampler's distribution (logits / T,
then the nucleus), J_T of the tempered policy and its gradient.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kljax.config import RLConfig, load_run_config
from kljax.models.transformer import positions_from_mask
from kljax.policies.tabular import TabularPolicy, all_responses
from kljax.rl.kl import KLConfig
from kljax.sampling import SampleResult
from kljax.sampling.logits import sampling_entropy, sampling_logprobs
from kljax.tasks.base import Example
from kljax.train.rollout import RolloutSetup, rollout, sampler_is_policy
from kljax.train.state import TrainState
from kljax.train.step import StepSettings, score, train_step
from kljax.verdicts.objective import RunObjective, describe_objective

VOCAB, R, STOP = 2, 2, 1
RESPONSES, MASKS = all_responses(VOCAB, R, STOP)


class _Tokens:
    """Prompt text "0" is token 0; a response decodes to its token ids joined by commas."""

    def encode(self, text, add_special_tokens=False):
        return [int(text)]

    def decode(self, ids, skip_special_tokens=True):
        return ",".join(str(i) for i in ids)


KEYS = [",".join(str(t) for t, m in zip(y, mk, strict=True) if m) for y, mk in zip(RESPONSES, MASKS, strict=True)]


class ForcedSampler:
    """The tabular policy behind the policy protocol, whose `sample` returns the batch being
    enumerated (`rows`: a response index per row) with the sampler's own float32 log-probs of those
    tokens (`kljax.sampling.logits.sampling_logprobs`: the distribution the sampler draws from)."""

    def __init__(self, policy: TabularPolicy):
        self.policy, self.rows = policy, None

    def teacher_forced(self, *args, **kwargs):
        return self.policy.teacher_forced(*args, **kwargs)

    def sample(self, params, prompt_tokens_bp, prompt_mask_bp, key, sampling, mesh=None):
        prompt = jnp.repeat(jnp.asarray(prompt_tokens_bp, jnp.int32), sampling.n, axis=0)
        tokens = jnp.asarray(RESPONSES[self.rows])
        mask = jnp.asarray(MASKS[self.rows])
        logits = self.policy.response_logits(params, prompt[:, -1], tokens).astype(jnp.float32)
        logp = jnp.stack([sampling_logprobs(logits[:, t], tokens[:, t], sampling) for t in range(R)], 1)
        ent = jnp.stack([sampling_entropy(logits[:, t], sampling) for t in range(R)], 1)
        seq = jnp.concatenate([prompt, tokens], 1)
        seq_mask = jnp.concatenate([jnp.ones_like(prompt, bool), mask], 1)
        return SampleResult(tokens, mask, jnp.where(mask, logp, 0.0), jnp.where(mask, ent, 0.0),
                            jnp.sum(mask, 1).astype(jnp.int32), jnp.any(tokens == STOP, 1), prompt,
                            jnp.ones_like(prompt, bool), seq, seq_mask, positions_from_mask(seq_mask),
                            jnp.asarray(R, jnp.int32))


def default_settings(**rl_changes) -> tuple[KLConfig, RLConfig]:
    """configs/default.py's kl and rl, buffers shrunk to the toy (one prompt of one token, R tokens)."""
    settings = load_run_config()
    rl = dataclasses.replace(settings.rl, prompts_per_step=1, max_prompt_len=1, max_new_tokens=R, **rl_changes)
    return settings.kl, rl


def sampler_probs(logits_qv: np.ndarray, rl: RLConfig) -> np.ndarray:
    """The sampler's next-token distribution at each prefix, float64, written here from its
    definition: softmax(logits / T), then the smallest top set of mass >= top_p, renormalized."""
    z = logits_qv / rl.temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if rl.top_p < 1:
        order = np.argsort(-p, -1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        keep_sorted = np.cumsum(sorted_p, -1) - sorted_p < rl.top_p
        keep = np.zeros_like(p, bool)
        np.put_along_axis(keep, order, keep_sorted, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return p


def sequence_logprob(policy: TabularPolicy, token_probs) -> jnp.ndarray:
    """log prob of every response under per-prefix next-token probabilities [Q, V] (prompt 0), [N]."""
    rows = np.asarray(policy.response_logits({"logits": jnp.arange(policy.num_prefixes)[None, :, None]
                                                        * jnp.ones((1, 1, VOCAB), jnp.int32)},
                                             jnp.zeros(len(RESPONSES), jnp.int32), jnp.asarray(RESPONSES))[..., 0])
    lp = jnp.log(token_probs)[rows, RESPONSES]
    return jnp.sum(jnp.where(MASKS, lp, 0.0), -1)


def true_gradient(policy, params, ref, rewards_n, beta, temperature) -> np.ndarray:
    """grad(-J_T), J_T = sum_y pi_T(y) (R(y) - beta log(pi_T(y) / pi_ref,T(y))), float64."""

    def j(p):
        logp = sequence_logprob(policy, jax.nn.softmax(p["logits"][0] / temperature, -1))
        ref_lp = sequence_logprob(policy, jax.nn.softmax(ref["logits"][0] / temperature, -1))
        return jnp.sum(jnp.exp(logp) * (rewards_n - beta * (logp - ref_lp)))

    return np.asarray(jax.flatten_util.ravel_pytree(jax.grad(lambda p: -j(p))(params))[0])


def expected_updates(kl: KLConfig, rl: RLConfig, seed: int = 0, lr: float = 1.0):
    """(E[first update], E[second update], E[grad(-J_T) at the first update's params], truth at
    the start): every batch through the real rollout and two train steps, weighted by its
    probability under the sampler (float64, computed here)."""
    policy = TabularPolicy(VOCAB, R, 1)
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = policy.init_params(k[0], 0.5, jnp.float64)
    ref = jax.tree.map(jnp.add, params, policy.init_params(k[1], 0.7, jnp.float64))
    rewards_n = np.asarray(jax.random.uniform(k[2], (len(RESPONSES),)), np.float32).astype(np.float64)
    reward_of = dict(zip(KEYS, rewards_n, strict=True))
    forced = ForcedSampler(policy)
    full = kl.estimator == "full"
    score_fn = jax.jit(functools.partial(score, model=policy, micro_batches=rl.micro_batches, full_kl=full,
                                         policy=not sampler_is_policy(rl, kl, forced),
                                         temperature=rl.policy_temperature))
    settings = StepSettings.from_rl(policy, kl, rl)
    tx = optax.sgd(lr)
    step = jax.jit(functools.partial(train_step, settings=settings, tx=tx))
    state0 = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.uint32))

    def rewards(examples, completions, *ids):
        r = np.asarray([reward_of[c] for c in completions], np.float32)
        return types.SimpleNamespace(rewards=r, correct=r > 0.5, parts={}, metrics={})

    q = sampler_probs(np.asarray(params["logits"][0]), rl)
    seq_q = np.exp(np.asarray(sequence_logprob(policy, jnp.asarray(q))))
    flat = lambda p: np.asarray(jax.flatten_util.ravel_pytree(p)[0])
    g1 = g2 = truth1 = 0.0
    for rows in itertools.product(range(len(RESPONSES)), repeat=rl.group_size):
        prob = float(np.prod(seq_q[list(rows)]))
        if prob == 0.0:
            continue
        forced.rows = np.asarray(rows)
        setup = RolloutSetup(None, _Tokens(), forced, rl, kl, score_fn, (STOP,), 0, reward_fn=rewards)
        batch, _ = rollout(setup, [Example("0", "", "toy", "train", "0")], sampler_params=params, params=params,
                           ref_params=ref, beta=kl.beta, key=jax.random.PRNGKey(0))
        state1, _ = step(state0, batch, ref)
        state2, _ = step(state1, batch, ref)
        g1 = g1 + prob * (flat(state0.params) - flat(state1.params)) / lr
        g2 = g2 + prob * (flat(state1.params) - flat(state2.params)) / lr
        truth1 = truth1 + prob * true_gradient(policy, state1.params, ref, rewards_n, kl.beta, rl.policy_temperature)
    truth0 = true_gradient(policy, params, ref, rewards_n, kl.beta, rl.policy_temperature)
    return g1, g2, truth1, truth0


def _fit(got, truth):
    """(best scale c, residual |got - c truth| / |got|, relative error |got - truth| / |truth|)."""
    c = float(got @ truth / (truth @ truth))
    return c, float(np.linalg.norm(got - c * truth) / np.linalg.norm(got)), \
        float(np.linalg.norm(got - truth) / np.linalg.norm(truth))


def _check(kl, rl, got, truth, updates_per_batch=1):
    """describe's verdict against the measured E[update]: unbiased/scaled to 1e-5 at its scale;
    biased: more than 1e-2 away from every multiple of grad J_T, or from the run's constant 1/R
    (rl's aggregation normalizer, the scale an unbiased run of these settings would have)."""
    info = describe_objective(RunObjective.from_rl(dataclasses.replace(rl, updates_per_batch=updates_per_batch), kl))
    c, residual, _ = _fit(got, truth)
    print(f"{info.name} (updates_per_batch {updates_per_batch}): {info.verdict}; measured scale {c:.6f}, "
          f"residual {residual:.2e}")
    if info.verdict == "biased":
        off_scale = abs(c * R - 1)
        assert residual > 1e-2 or off_scale > 1e-2, \
            f"{info.name}: describe says biased, measured residual {residual:.2e}, scale {c} (c R - 1: {off_scale:.1e})"
    else:
        assert residual < 1e-5 and c == pytest.approx(info.scale, rel=1e-5), \
            f"{info.name}: describe says {info.verdict} x {info.scale}, measured {c} (residual {residual:.2e})"
    return info


@pytest.fixture(scope="module")
def x64():
    with jax.enable_x64(True):
        yield


def test_shipped_default_run_verdict_holds_through_the_real_rollout(x64):
    """Temperature 0.8 as shipped: the sampler's log-probs are the tempered policy's (reused), the
    first update is 1/R x grad J_T, and the second update on the same batch is biased, as stated."""
    kl, rl = default_settings()
    assert rl.temperature == 0.8 and rl.top_p == 1.0 and rl.top_k == 0 and rl.reuse_sampler_logprobs
    assert sampler_is_policy(rl, kl, ForcedSampler(TabularPolicy(VOCAB, R, 1)))
    g1, g2, truth1, truth0 = expected_updates(kl, rl)
    info = _check(kl, rl, g1, truth0)
    assert info.verdict == "scaled" and info.scale == pytest.approx(1 / R)
    assert "softmax(logits / 0.8)" in info.gradient
    full_run = load_run_config().rl
    assert describe_objective(RunObjective.from_rl(full_run, kl)).gradient.startswith(
        f"1/{full_run.max_new_tokens} x grad J (for the tempered policy: pi = softmax(logits / 0.8)")
    _check(kl, rl, g2, truth1, updates_per_batch=2)


@pytest.mark.parametrize("change", [dict(top_p=0.8), dict(advantage="grpo"), dict(mask_truncated=True),
                                    dict(advantage="grpo", advantage_scale="batch")],
                         ids=["top_p", "grpo", "mask_truncated", "grpo_batch_std"])
def test_truncating_sampler_and_grpo_are_biased_as_stated(x64, change):
    kl, rl = default_settings(**change)
    g1, _, _, truth0 = expected_updates(kl, rl)
    assert _check(kl, rl, g1, truth0).verdict == "biased"


@pytest.mark.parametrize("advantage, verdict", [("rloo", "scaled"), ("dr_grpo", "biased")])
def test_kl_outside_the_baseline(x64, advantage, verdict):
    """OpenRLHF's placement: the per-token KL added after the baseline, reward-to-go. RLOO keeps
    1/R x grad J_T; Dr. GRPO scales the task reward by (G-1)/G but not the KL."""
    kl, rl = default_settings(advantage=advantage, clip_ratio_c=3.0)
    kl = kl.replace(credit="reward_to_go", in_baseline=False, beta=0.5)
    g1, _, _, truth0 = expected_updates(kl, rl)
    assert _check(kl, rl, g1, truth0).verdict == verdict
