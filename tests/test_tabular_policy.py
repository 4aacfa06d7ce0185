"""The tabular policy behind the policy protocol: its sampler draws from pi (log-probs equal the
teacher-forced ones, frequencies match the exact probabilities), and the real rollout and train
step run on it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from kljax.config import RLConfig
from kljax.policies.protocol import PolicyModel, as_policy
from kljax.policies.tabular import TabularPolicy, all_responses, sequence_probabilities
from kljax.rl.kl import KLConfig
from kljax.sampling import SamplingParams
from kljax.tasks.base import Example, Score, Task
from kljax.train.rollout import RolloutSetup, rollout
from kljax.train.state import TrainState
from kljax.train.step import StepSettings, score, train_step

POLICY = TabularPolicy(vocab=3, response_len=3, num_prompts=2)
STOP = 2


def _sample(n: int, seed: int = 0):
    params = POLICY.init_params(jax.random.PRNGKey(seed), 1.0)
    prompts = np.asarray([[0], [1]], np.int32)
    sp = SamplingParams(max_new_tokens=3, stop_token_ids=(STOP,), n=n, entropy=True)
    return params, POLICY.sample(params, prompts, None, jax.random.PRNGKey(seed + 1), sp)


def test_protocol():
    assert isinstance(POLICY, PolicyModel) and as_policy(POLICY) is POLICY


def test_sampler_logprobs_equal_teacher_forced_and_stop_masking():
    params, out = _sample(64)
    tf = POLICY.teacher_forced(params, out.sequence_tokens_rs, out.sequence_mask_rs, out.sequence_positions_rs, 3,
                               entropy=True)
    mask = np.asarray(out.response_mask_rn)
    np.testing.assert_allclose(np.where(mask, tf["logp"], 0), out.response_logprobs_rn, atol=1e-6)
    np.testing.assert_allclose(np.where(mask, tf["entropy"], 0), out.response_entropy_rn, atol=1e-6)
    tokens = np.asarray(out.response_tokens_rn)
    for row, m in zip(tokens, mask, strict=True):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # a prefix of the buffer
        assert STOP not in row[: n - 1] and (n == 3 or row[n - 1] == STOP)  # ends at the first stop token


def test_sampler_frequencies_match_exact_probabilities():
    n = 4000
    params, out = _sample(n, seed=3)
    responses, mask = all_responses(3, 3, STOP)
    for prompt in (0, 1):
        probs = np.asarray(sequence_probabilities(POLICY, params, prompt, responses, mask))
        np.testing.assert_allclose(probs.sum(), 1.0, atol=1e-6)
        rows = np.asarray(out.response_tokens_rn)[prompt * n : (prompt + 1) * n]
        counts = np.asarray([np.all(rows == r, axis=1).sum() for r in responses])
        assert counts.sum() == n
        sigma = np.sqrt(probs * (1 - probs) / n)
        assert np.all(np.abs(counts / n - probs) <= 5 * sigma + 1e-3), (counts / n, probs)


class _Tokenizer:
    """Prompt text "p" is the single token p; a response decodes to its token ids as digits."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(text)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(str(i) for i in ids)


class _TableTask(Task):
    name, splits = "table", ("train",)

    def examples(self, split, n=None, seed=0):
        return [Example(str(p), "", self.name, split, str(p)) for p in range(2)]

    def check(self, example, completion):
        return Score(float(completion.count("1")) - 0.5 * len(completion), False)


def test_rollout_and_train_step_run_on_the_tabular_policy():
    rl = RLConfig(group_size=4, prompts_per_step=2, max_prompt_len=1, max_new_tokens=3)
    kl = KLConfig("k1", "reward", beta=0.1)
    params = POLICY.init_params(jax.random.PRNGKey(0), 0.5)
    ref = jax.tree.map(lambda x: x + 0.2, params)
    task = _TableTask()
    score_fn = jax.jit(functools.partial(score, model=POLICY, policy=False))
    setup = RolloutSetup(task, _Tokenizer(), POLICY, rl, kl, score_fn, (STOP,), 0)
    batch, info = rollout(setup, task.examples("train"), sampler_params=params, params=params, ref_params=ref,
                          beta=0.1, key=jax.random.PRNGKey(1))
    assert batch.tokens_bs.shape == (8, 4) and batch.advantages_br.shape == (8, 3)
    expected = [task.check(None, c).reward for c in info.completions]
    np.testing.assert_allclose(info.rewards, expected, rtol=1e-6)
    # RLOO: each group's advantages sum to zero at every position under sequence credit
    per_seq = np.asarray(batch.advantages_br)[:, 0].reshape(2, 4)
    np.testing.assert_allclose(per_seq.sum(axis=1), 0.0, atol=1e-5)
    tx = optax.sgd(0.1)
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jnp.zeros((2,), jnp.uint32))
    new, metrics = jax.jit(functools.partial(train_step, settings=StepSettings(POLICY, kl), tx=tx))(state, batch, ref)
    assert float(metrics["nonfinite"]) == 0.0
    assert float(jnp.max(jnp.abs(new.params["logits"] - params["logits"]))) > 0
