"""Toy tasks with an exact optimum: a tabular policy's prompts, every response enumerated.

Prompt p has the responses y of `tabular.all_responses(V, R, stop = V - 1)` (N of them) and a
reward table R_p(y) of one shape: "sparse" (1 on one sequence the reference finds unlikely),
"long" (length / R), "conflict" (the reference's own surprisal, scaled to [0, 1]: it rewards what
pi_ref avoids). For J_p(pi) = E_pi[R_p] - beta KL(pi || pi_ref) the maximizer is
    pi*(y|p) = pi_ref(y|p) exp(R_p(y) / beta) / Z_p,      log Z_p = logsumexp_y(log pi_ref + R_p / beta),
and for every pi:  J_p(pi*) - J_p(pi) = beta KL(pi || pi*)  (the "gap"). Task-level values are
means over prompts. Everything here is exact (sums over the N responses) and dtype-generic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.models.transformer import positions_from_mask
from kljax.policies.tabular import TabularPolicy, all_responses

Array = jax.Array
SHAPES = ("sparse", "long", "conflict")


@dataclasses.dataclass(frozen=True, eq=False)
class ToyTask:
    """policy: any policy model (`kljax.policies.protocol`) whose prompt p is the one token p and
    whose responses are over tokens 0..V-1 (TabularPolicy(V, R, P), or a transformer with
    vocab_size V >= P); ref_params: pi_ref; shapes: one per prompt; responses_nr / mask_nr: every
    response [N, R]; rewards_pn: R_p(y) [P, N] float."""

    policy: Any
    ref_params: Any
    shapes: tuple[str, ...]
    responses_nr: np.ndarray
    mask_nr: np.ndarray
    rewards_pn: np.ndarray

    @property
    def stop_token(self) -> int:
        return int(self.responses_nr.max())

    @property
    def num_prompts(self) -> int:
        return len(self.shapes)

    @property
    def response_len(self) -> int:
        return self.responses_nr.shape[1]

    @property
    def vocab(self) -> int:
        return self.stop_token + 1


def make_task(shapes: tuple[str, ...] = SHAPES, vocab: int = 3, response_len: int = 3, ref_scale: float = 1.0,
              seed: int = 0, dtype: Any = jnp.float32, policy: Any = None, ref_params: Any = None) -> ToyTask:
    """One prompt per shape. Default policy: TabularPolicy(vocab, response_len, len(shapes)) with
    pi_ref's logits ~ ref_scale * N(0, 1) (PRNGKey(seed)); or the given policy and its ref_params."""
    bad = [s for s in shapes if s not in SHAPES]
    if bad or not shapes:
        raise ValueError(f"toy task shapes {list(shapes)!r}: {bad or 'none given'} not valid; "
                         f"choose from {list(SHAPES)}")
    if policy is None:
        policy = TabularPolicy(vocab, response_len, len(shapes))
        ref_params = policy.init_params(jax.random.PRNGKey(seed), scale=ref_scale, dtype=dtype)
    elif ref_params is None:
        raise ValueError("make_task: a given policy needs its ref_params")
    responses, mask = all_responses(vocab, response_len, vocab - 1)
    ref_logp = np.asarray(sequence_logps(policy, ref_params, responses, mask, len(shapes)), np.float64)
    lengths = mask.sum(1)
    rows = []
    for p, shape in enumerate(shapes):
        if shape == "sparse":  # the least likely full-length response under pi_ref
            full = np.where(lengths == response_len, ref_logp[p], np.inf)
            r = np.zeros(len(responses))
            r[int(np.argmin(full))] = 1.0
        elif shape == "long":
            r = lengths / response_len
        else:
            s = -ref_logp[p]
            r = (s - s.min()) / (s.max() - s.min())
        rows.append(r)
    return ToyTask(policy, ref_params, tuple(shapes), responses, mask, np.asarray(rows))


def enumerated_batch(responses_nr: np.ndarray, mask_nr: np.ndarray, num_prompts: int) -> tuple[Array, ...]:
    """Every (prompt, response) as teacher-forcing input, prompt-major: tokens, mask, positions
    [P * N, 1 + R] and the response mask [P * N, R]."""
    n = responses_nr.shape[0]
    prompt = np.repeat(np.arange(num_prompts, dtype=np.int32), n)[:, None]
    tokens = jnp.asarray(np.concatenate([prompt, np.tile(responses_nr, (num_prompts, 1))], axis=1))
    rmask = np.tile(mask_nr, (num_prompts, 1))
    mask = jnp.asarray(np.concatenate([np.ones_like(prompt, bool), rmask], axis=1))
    return tokens, mask, positions_from_mask(mask), jnp.asarray(rmask)


def sequence_logps(policy: Any, params: Any, responses_nr: np.ndarray, mask_nr: np.ndarray,
                   num_prompts: int) -> Array:
    """log pi(y | p) of every response for every prompt, [P, N], from the policy's teacher_forced."""
    tokens, mask, positions, rmask = enumerated_batch(responses_nr, mask_nr, num_prompts)
    logp = policy.teacher_forced(params, tokens, mask, positions, responses_nr.shape[1])["logp"]
    return jnp.sum(jnp.where(rmask, logp, 0.0), axis=-1).reshape(num_prompts, -1)


def task_logps(task: ToyTask, params: Any) -> Array:
    """log pi(y | p), [P, N], of the task's policy with `params`."""
    return sequence_logps(task.policy, params, task.responses_nr, task.mask_nr, task.num_prompts)


def optimal_logp(ref_logp_pn: Array, rewards_pn: Array, beta: float | Array) -> Array:
    """log pi*(y|p) = log pi_ref + R / beta - log Z, [P, N]."""
    return jax.nn.log_softmax(ref_logp_pn + jnp.asarray(rewards_pn, ref_logp_pn.dtype) / beta, axis=-1)


def _kl(logp_pn: Array, logq_pn: Array) -> Array:
    """KL(p || q) per prompt, [P]; terms with p = 0 are 0 (a NaN anywhere stays NaN)."""
    p = jnp.exp(logp_pn)
    return jnp.sum(jnp.where(p == 0, 0.0, p * (logp_pn - logq_pn)), axis=-1)


def exact_metrics(logp_pn: Array, ref_logp_pn: Array, rewards_pn: Array, beta: float | Array) -> dict[str, Array]:
    """Means over prompts of: J = E_pi[R] - beta KL_seq, reward = E_pi[R], kl_seq = KL(pi || pi_ref),
    gap = beta KL(pi || pi*) (= J(pi*) - J), kl_opt = KL(pi* || pi), J_opt = J(pi*)."""
    rewards = jnp.asarray(rewards_pn, logp_pn.dtype)
    opt = optimal_logp(ref_logp_pn, rewards, beta)
    reward = jnp.sum(jnp.exp(logp_pn) * rewards, axis=-1)
    kl_seq = _kl(logp_pn, ref_logp_pn)
    j_opt = jnp.sum(jnp.exp(opt) * rewards, axis=-1) - beta * _kl(opt, ref_logp_pn)
    return {
        "J": jnp.mean(reward - beta * kl_seq),
        "reward": jnp.mean(reward),
        "kl_seq": jnp.mean(kl_seq),
        "gap": jnp.mean(beta * _kl(logp_pn, opt)),
        "kl_opt": jnp.mean(_kl(opt, logp_pn)),
        "J_opt": jnp.mean(j_opt),
    }


def objective(logp_pn: Array, ref_logp_pn: Array, rewards_pn: Array, beta: float | Array) -> Array:
    """J(pi) = mean_p sum_y pi (R - beta log(pi / pi_ref)), the brute-force definition."""
    p = jnp.exp(logp_pn)
    return jnp.mean(jnp.sum(p * (jnp.asarray(rewards_pn, logp_pn.dtype) - beta * (logp_pn - ref_logp_pn)), -1))
