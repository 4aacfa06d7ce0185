"""Exact mode: every configuration's expected gradient and exact per-sample variance, by enumeration.

`Engine(setting, configs)` enumerates the V^T sequences of the setting's policy in chunks of
`chunk_size` rows and sums, for a sampler q (a `Behaviour`) and a response length T' <= T:
    E_q[g_c] = sum_y q(y) g_c(y),   E_q||g_c||^2 = sum_y q(y) ||g_c(y)||^2,
with g_c(y) the parameter gradient of the configuration's `kl_surrogate` on sequence y (see
`kljax.studies.bias.gradients`), together with the truth grad KL_seq (and grad E[R]) at theta. Chunking
bounds memory by the chunk, not by V^T; the compiled functions depend only on the configurations,
the policy and the chunk shape, so every sampler, length and seed reuses them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from kljax.rl.kl import KLConfig
from kljax.studies.bias.gradients import (
    Moments,
    PerSequence,
    length_mask,
    per_sequence,
    toy_reward_masked,
    truncation_fraction,
)
from kljax.studies.bias.policies import (
    Behaviour,
    Params,
    ToyPolicy,
    behaviour_logits,
    check_enumeration,
    enumerate_sequences,
    sequence_logps,
)
from kljax.studies.bias.setting import Setting

Array = jax.Array


@functools.partial(jax.jit, static_argnums=0)
def three_logits(
    policy: ToyPolicy, theta: Params, ref: Params, behaviour: Behaviour, seqs_nt: Array
) -> tuple[Array, Array, Array]:
    """Logits [N, T, V] of theta, the reference and the sampler on the given sequences."""
    return policy.logits(theta, seqs_nt), policy.logits(ref, seqs_nt), behaviour_logits(policy, behaviour, seqs_nt)


@functools.partial(jax.jit, static_argnums=0)
def exact_reduce(
    policy: ToyPolicy, theta: Params, seqs_nt: Array, cots_kntv: Array, weights_n: Array
) -> tuple[Array, Array, Array]:
    """(sum_n w_n g_kn [K, D], sum_n w_n ||g_kn||^2 [K], sum_n w_n <g_kn, g_(K-1)n> [K])."""
    return policy.sample_moments(theta, seqs_nt, cots_kntv, weights_n)


@functools.partial(jax.jit, static_argnums=0)
def truth_chunk(
    policy: ToyPolicy, theta: Params, ref: Params, seqs_nt: Array, weight_n: Array, length: Array
) -> tuple[Array, Array, Array, Array]:
    """Chunk's share of (KL_seq, E[R], grad KL_seq [D], grad E[R] [D]) for responses of `length`
    tokens; weight_n zeroes padding rows."""
    mask, canonical = length_mask(seqs_nt, length, jax.tree_util.tree_leaves(theta)[0].dtype)
    reward_n = toy_reward_masked(seqs_nt, mask, policy.vocab)
    ref_n = jnp.sum(sequence_logps(policy.logits(ref, seqs_nt), seqs_nt) * mask, axis=1)

    def parts(params: Params) -> tuple[Array, Array]:
        logp_n = jnp.sum(sequence_logps(policy.logits(params, seqs_nt), seqs_nt) * mask, axis=1)
        p_n = jnp.exp(logp_n) * canonical * weight_n
        return jnp.sum(p_n * (logp_n - ref_n)), jnp.sum(p_n * reward_n)

    (kl, reward), vjp = jax.vjp(parts, theta)
    g_kl = policy.flatten(vjp((jnp.ones_like(kl), jnp.zeros_like(reward)))[0])
    g_reward = policy.flatten(vjp((jnp.zeros_like(kl), jnp.ones_like(reward)))[0])
    return kl, reward, g_kl, g_reward


class Engine:
    """Exact (and, via `kljax.studies.bias.montecarlo`, sampled) gradient moments of `configs` in a setting.

    configs: the KL configurations (stream k); a reward stream is always appended last.
    chunk_size: enumerated sequences per compiled call (exact mode).
    mc_chunk_size: sampled sequences per compiled call in Monte-Carlo mode (default max(chunk, 4096)).
    memory_budget_gb: exact enumeration is refused (ValueError naming vocab, length and the
    estimated bytes) when the estimate exceeds it."""

    def __init__(
        self,
        setting: Setting,
        configs: tuple[KLConfig, ...],
        chunk_size: int = 4096,
        memory_budget_gb: float = 4.0,
        mc_chunk_size: int | None = None,
    ) -> None:
        if not configs:
            raise ValueError("configs is empty: give at least one KL configuration")
        self.setting = setting
        self.policy = setting.policy
        self.configs = tuple(configs)
        self.n_params = self.policy.num_params()
        dtype = jax.tree_util.tree_leaves(setting.ref)[0].dtype
        self.itemsize = jnp.dtype(dtype).itemsize
        n_seq = self.policy.vocab**self.policy.length
        self.chunk = int(chunk_size)
        if self.chunk < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        self.mc_chunk = max(self.chunk, 4096) if mc_chunk_size is None else int(mc_chunk_size)
        self.estimated_bytes = check_enumeration(
            self.policy.vocab,
            self.policy.length,
            len(self.configs) + 1,
            self.n_params,
            self.itemsize,
            memory_budget_gb * 2**30,
            rows=max(min(self.chunk, n_seq), self.mc_chunk),
        )
        self.seqs = np.asarray(enumerate_sequences(self.policy))
        self._truth: dict[int, dict[str, np.ndarray | float]] = {}

    @property
    def n_configs(self) -> int:
        return len(self.configs)

    def chunks(self) -> list[tuple[Array, Array]]:
        """The enumeration in chunks of exactly `chunk` rows: (seqs [M, T], valid [M]); padding rows
        repeat the first sequence and have valid = 0."""
        out = []
        n = self.seqs.shape[0]
        for start in range(0, n, self.chunk):
            part = self.seqs[start : start + self.chunk]
            pad = self.chunk - part.shape[0]
            valid = np.concatenate([np.ones(part.shape[0]), np.zeros(pad)])
            if pad:
                part = np.concatenate([part, np.repeat(self.seqs[:1], pad, axis=0)])
            out.append((jnp.asarray(part), jnp.asarray(valid, self.dtype)))
        return out

    @property
    def dtype(self) -> jnp.dtype:
        return jax.tree_util.tree_leaves(self.setting.ref)[0].dtype

    def check_length(self, length: int | None) -> int:
        length = self.policy.length if length is None else int(length)
        if not 1 <= length <= self.policy.length:
            raise ValueError(f"length={length} is out of range: this setting has responses of 1..{self.policy.length}")
        return length

    def truth(self, length: int | None = None) -> dict[str, np.ndarray | float]:
        """Exact KL_seq, E[R], grad KL_seq [D] and -grad E[R] [D] at theta for `length` tokens."""
        length = self.check_length(length)
        if length not in self._truth:
            theta, ref = self.setting.theta, self.setting.ref
            parts = [truth_chunk(self.policy, theta, ref, s, v, jnp.asarray(length)) for s, v in self.chunks()]
            kl, reward, g_kl, g_reward = (sum(np.asarray(p[i], np.float64) for p in parts) for i in range(4))
            self._truth[length] = {
                "kl": float(kl),
                "reward": float(reward),
                "kl_grad": g_kl,
                "reward_loss_grad": -g_reward,
            }
        return self._truth[length]

    def per_sequence(self, behaviour: Behaviour, seqs_nt: Array, length: int) -> PerSequence:
        """Every stream's per-sequence logit gradients on the given sequences (see `gradients`)."""
        theta, ref = self.setting.theta, self.setting.ref
        logits, ref_logits, sampler_logits = three_logits(self.policy, theta, ref, behaviour, seqs_nt)
        baseline = jnp.asarray(self.truth(length)["reward"], self.dtype)
        return per_sequence(
            self.configs, self.policy.vocab, seqs_nt, jnp.asarray(length), logits, ref_logits, sampler_logits, baseline
        )

    def exact(self, behaviour: Behaviour, length: int | None = None) -> Moments:
        """Exact moments of every stream under the sampler, for responses of `length` tokens."""
        length = self.check_length(length)
        total = None
        truncated = np.zeros(self.n_configs)
        for seqs, valid in self.chunks():
            ps = self.per_sequence(behaviour, seqs, length)
            q = ps.q_n * valid
            mean_kd, sq_k, cross_k = exact_reduce(self.policy, self.setting.theta, seqs, ps.cots_kntv, q)
            truncated += truncation_fraction(self.configs, np.asarray(ps.log_w_n), np.asarray(q))
            part = Moments(np.asarray(mean_kd), np.asarray(sq_k), np.asarray(cross_k), np.zeros(self.n_configs))
            total = part if total is None else total + part
        total.truncated_k = truncated
        return total

    def kl_between(self, behaviour: Behaviour, length: int | None = None) -> float:
        """KL_seq(pi_theta || mu): how far the sampler is from the current policy."""
        length = self.check_length(length)
        out = 0.0
        for seqs, valid in self.chunks():
            logits, _, sampler_logits = three_logits(self.policy, self.setting.theta, self.setting.ref, behaviour, seqs)
            mask, canonical = length_mask(seqs, length, self.dtype)
            logp = jnp.sum(sequence_logps(logits, seqs) * mask, axis=1)
            logq = jnp.sum(sequence_logps(sampler_logits, seqs) * mask, axis=1)
            out += float(jnp.sum(jnp.exp(logp) * canonical * valid * (logp - logq)))
        return out
