"""Toy policies for gradient-bias studies: a common interface over the tabular policy and the tiny
transformer, behaviour (sampler) policies at a controlled distance, sampling and enumeration limits.

A toy policy maps parameters and token sequences `seqs_nt` [N, T] (int32, values < V) to the
teacher-forced next-token logits `logits_ntv` [N, T, V]: row t is the logits of pi(. | y_<t), which
never depends on y_t..y_{T-1}. Everything else (log-probs, the KL surrogates, exact expectations,
sampling) is computed from those logits, so both policies share one code path. Gradients are taken
in logit space (`dS/dlogits_ntv`, the "cotangent") and pulled back to parameters by `grad_params`
(J^T c, with J = d logits / d params).

A behaviour policy mu has logits (1 - alpha) * f(base) + alpha * f(other): base = theta gives the
on-policy sampler (alpha = 0), base = theta from N optimizer steps earlier a stale sampler, and
alpha > 0 an interpolation in logit space toward another policy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from kljax.policies.tabular import prefix_rows
from kljax.studies.bias.tabular import TabularSpace, all_sequences
from kljax.studies.bias.transformer import TinyTransformer, numpy_rng

Array = jax.Array
Params = Any

MAX_VOCAB = 8
MAX_LENGTH = 8
POLICY_KINDS = ("tabular", "transformer")


def check_space(vocab: int, length: int) -> None:
    """Raise ValueError naming the value and the valid range for an unusable vocabulary or length."""
    if not isinstance(vocab, (int, np.integer)) or not 2 <= vocab <= MAX_VOCAB:
        raise ValueError(
            f"vocab={vocab!r} is out of range: toy studies enumerate sequences, use 2 <= vocab <= {MAX_VOCAB}"
        )
    if not isinstance(length, (int, np.integer)) or not 1 <= length <= MAX_LENGTH:
        raise ValueError(
            f"length={length!r} is out of range: toy studies enumerate sequences, use 1 <= length <= {MAX_LENGTH}"
        )


def enumeration_bytes(
    vocab: int, length: int, n_streams: int, n_params: int, itemsize: int = 8, rows: int | None = None
) -> int:
    """Estimated peak bytes of an exact study: the V^T enumerated sequences (int32, host and device
    copies), per chunk of `rows` sequences (default all) T x V logits for each of the `n_streams`
    per-sequence gradients plus ~8 working arrays, and a few parameter-sized vectors per stream."""
    n_seq = vocab**length
    rows = n_seq if rows is None else min(rows, n_seq)
    sequences = 2 * n_seq * length * 4 + 4 * n_seq * itemsize
    per_chunk = rows * length * vocab * itemsize * (n_streams + 8)
    return sequences + per_chunk + n_params * itemsize * (2 * n_streams + 4)


def check_enumeration(
    vocab: int,
    length: int,
    n_streams: int,
    n_params: int,
    itemsize: int = 8,
    budget_bytes: float = 4 * 2**30,
    rows: int | None = None,
) -> int:
    """Check a space can be enumerated within `budget_bytes`; return the estimated bytes.

    Raises ValueError naming vocab, length, the number of sequences and the estimated bytes when it
    cannot (before any large array is allocated)."""
    check_space(vocab, length)
    need = enumeration_bytes(vocab, length, n_streams, n_params, itemsize, rows)
    if need > budget_bytes:
        raise ValueError(
            f"vocab={vocab}, length={length}: exact enumeration of {vocab}**{length} = {vocab**length:,} sequences "
            f"({n_params:,} policy parameters, {n_streams} gradient streams) needs about {need / 2**30:.2f} GiB, "
            f"over the memory budget of {budget_bytes / 2**30:.2f} GiB. Use a smaller vocab or length "
            f"(valid: vocab 2..{MAX_VOCAB}, length 1..{MAX_LENGTH}, within the budget), fewer configurations, "
            "or raise memory_budget_gb."
        )
    return need


def prefix_ids_array(vocab: int, seqs_nt: Array) -> Array:
    """Row of the tabular `logits_pv` used at each position, [N, T] int32 (`models.tabular.prefix_rows`)."""
    return prefix_rows(vocab, seqs_nt)


@dataclasses.dataclass(frozen=True)
class ToyPolicy:
    """Interface: `init`, `logits`, `grad_params`, `sample_moments`; subclasses set the model."""

    vocab: int
    length: int

    kind = "base"

    def init(self, key: Any, dtype=jnp.float32) -> Params:
        """Random parameters; key: a JAX key, an int seed or a NumPy Generator (host-side draw)."""
        raise NotImplementedError

    def logits(self, params: Params, seqs_nt: Array) -> Array:
        """Next-token logits [N, T, V] (row t: pi(. | y_<t))."""
        raise NotImplementedError

    def num_params(self) -> int:
        raise NotImplementedError

    def flatten(self, params: Params) -> Array:
        """Parameters as one vector [D]."""
        return ravel_pytree(params)[0]

    def grad_params(self, params: Params, seqs_nt: Array, cot_ntv: Array) -> Array:
        """J^T c: the parameter gradient [D] of sum_{n,t,v} cot_ntv * logits_ntv(params)."""
        out, vjp = jax.vjp(lambda p: self.logits(p, seqs_nt), params)
        return self.flatten(vjp(cot_ntv.astype(out.dtype))[0])

    def sample_moments(
        self, params: Params, seqs_nt: Array, cots_kntv: Array, weights_n: Array
    ) -> tuple[Array, Array, Array]:
        """Weighted moments of K per-sequence parameter gradients. With g_kn = J_n^T c_kn the
        parameter gradient of stream k on sequence n alone (c_kn = cots_kntv[k, n], [T, V]):
            mean_kd = sum_n w_n g_kn                  [K, D]
            sq_k    = sum_n w_n ||g_kn||^2            [K]
            cross_k = sum_n w_n <g_kn, g_(K-1)n>      [K]   (inner product with the last stream).
        Generic version: a scan over groups of sequences, one VJP per sequence (vmapped in a group)
        applied to all K cotangents; memory is one group's [group, K, D]."""
        n = seqs_nt.shape[0]
        group = math.gcd(n, 32)
        k = cots_kntv.shape[0]
        d = self.flatten(params).shape[0]
        dtype = cots_kntv.dtype

        def one(seq_t: Array, cot_ktv: Array) -> Array:
            _, vjp = jax.vjp(lambda p: self.logits(p, seq_t[None])[0], params)
            return jax.vmap(lambda c: self.flatten(vjp(c)[0]))(cot_ktv)  # [K, D]

        def step(carry: tuple[Array, Array, Array], xs: tuple[Array, Array, Array]) -> tuple[tuple, None]:
            mean, sq, cross = carry
            seqs_g, cots_gktv, w_g = xs
            g_gkd = jax.vmap(one)(seqs_g, cots_gktv)
            mean = mean + jnp.einsum("g,gkd->kd", w_g, g_gkd)
            sq = sq + jnp.einsum("g,gkd->k", w_g, g_gkd * g_gkd)
            cross = cross + jnp.einsum("g,gkd,gd->k", w_g, g_gkd, g_gkd[:, -1])
            return (mean, sq, cross), None

        cots_nktv = jnp.swapaxes(cots_kntv, 0, 1)
        xs = (
            seqs_nt.reshape(n // group, group, -1),
            cots_nktv.reshape(n // group, group, *cots_nktv.shape[1:]),
            weights_n.reshape(n // group, group),
        )
        init = (jnp.zeros((k, d), dtype), jnp.zeros((k,), dtype), jnp.zeros((k,), dtype))
        (mean, sq, cross), _ = jax.lax.scan(step, init, xs)
        return mean, sq, cross

    def perturb(self, key: Any, params: Params, scale: float) -> Params:
        """params + scale * (a fresh random initialization): a policy at a controlled distance."""
        noise = self.init(key, jax.tree_util.tree_leaves(params)[0].dtype)
        return jax.tree_util.tree_map(lambda p, e: p + scale * e, params, noise)


@dataclasses.dataclass(frozen=True)
class TabularPolicy(ToyPolicy):
    """One free logit row per prefix, params `logits_pv` [P, V] (see `kljax.studies.bias.tabular`)."""

    scale: float = 1.0
    kind = "tabular"

    def init(self, key: Any, dtype=jnp.float32) -> Params:
        p = TabularSpace(self.vocab, self.length).num_prefixes
        return jnp.asarray(self.scale * numpy_rng(key).standard_normal((p, self.vocab)), dtype)

    def num_params(self) -> int:
        return TabularSpace(self.vocab, self.length).num_prefixes * self.vocab

    def logits(self, params: Params, seqs_nt: Array) -> Array:
        return params[prefix_ids_array(self.vocab, seqs_nt)]

    def flatten(self, params: Params) -> Array:
        return params.reshape(-1)

    def grad_params(self, params: Params, seqs_nt: Array, cot_ntv: Array) -> Array:
        ids = prefix_ids_array(self.vocab, seqs_nt)
        return jnp.zeros(params.shape, cot_ntv.dtype).at[ids].add(cot_ntv).reshape(-1)

    def sample_moments(
        self, params: Params, seqs_nt: Array, cots_kntv: Array, weights_n: Array
    ) -> tuple[Array, Array, Array]:
        # One scatter-add per stream for the mean; and since the T prefixes of one sequence are
        # distinct rows, ||J_n^T c||^2 = ||c||^2 and <J_n^T a, J_n^T b> = <a, b> exactly.
        mean_kd = jax.vmap(lambda c: self.grad_params(params, seqs_nt, c * weights_n[:, None, None]))(cots_kntv)
        sq_k = jnp.einsum("n,kntv->k", weights_n, cots_kntv * cots_kntv)
        cross_k = jnp.einsum("n,kntv,ntv->k", weights_n, cots_kntv, cots_kntv[-1])
        return mean_kd, sq_k, cross_k


@dataclasses.dataclass(frozen=True)
class TransformerPolicy(ToyPolicy):
    """The tiny causal transformer of `kljax.studies.bias.transformer` (params: a dict pytree)."""

    d_model: int = 16
    n_heads: int = 2
    n_layers: int = 2
    logit_scale: float = 1.5
    kind = "transformer"

    @property
    def model(self) -> TinyTransformer:
        return TinyTransformer(
            self.vocab, self.length, self.d_model, self.n_heads, self.n_layers, logit_scale=self.logit_scale
        )

    def init(self, key: Any, dtype=jnp.float32) -> Params:
        return self.model.init(key, dtype)

    def num_params(self) -> int:
        return self.model.num_params()

    def logits(self, params: Params, seqs_nt: Array) -> Array:
        return self.model.apply(params, seqs_nt)


def make_policy(kind: str, vocab: int, length: int, **kwargs: Any) -> ToyPolicy:
    """Policy by name ('tabular' or 'transformer'); unknown names list the valid ones."""
    check_space(vocab, length)
    if kind == "tabular":
        return TabularPolicy(vocab, length, **kwargs)
    if kind == "transformer":
        return TransformerPolicy(vocab, length, **kwargs)
    raise ValueError(f"unknown policy {kind!r}; valid policies: {list(POLICY_KINDS)}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Behaviour:
    """Sampler mu with logits f(base) + alpha * (f(other) - f(base)); other None means alpha = 0."""

    base: Params
    other: Params | None = None
    alpha: Array | float = 0.0


def behaviour_logits(policy: ToyPolicy, behaviour: Behaviour, seqs_nt: Array) -> Array:
    """The sampler's next-token logits [N, T, V]."""
    base = policy.logits(behaviour.base, seqs_nt)
    if behaviour.other is None:
        return base
    return base + behaviour.alpha * (policy.logits(behaviour.other, seqs_nt) - base)


def sample(policy: ToyPolicy, behaviour: Behaviour, key: Array, n: int) -> Array:
    """Draw n sequences y ~ mu autoregressively (jax.random.categorical per position): [n, T] int32.

    Position t's logits are computed on the partial buffer; causality makes the unfilled tail
    irrelevant, so each step is one batched forward pass (T passes in all, fine for toy lengths)."""
    keys = jax.random.split(key, policy.length)

    def step(seqs_nt: Array, t: Array) -> tuple[Array, None]:
        logits_nv = jnp.take(behaviour_logits(policy, behaviour, seqs_nt), t, axis=1)
        token_n = jax.random.categorical(keys[t], logits_nv, axis=-1).astype(jnp.int32)
        return seqs_nt.at[:, t].set(token_n), None

    seqs, _ = jax.lax.scan(step, jnp.zeros((n, policy.length), jnp.int32), jnp.arange(policy.length))
    return seqs


def enumerate_sequences(policy: ToyPolicy) -> Array:
    """All V^T sequences of the policy's space, [V^T, T] int32 (lexicographic)."""
    return jnp.asarray(all_sequences(TabularSpace(policy.vocab, policy.length)))


def sequence_logps(logits_ntv: Array, seqs_nt: Array) -> Array:
    """log pi(y_t | y_<t) for each sequence and position: [N, T]."""
    logp_ntv = jax.nn.log_softmax(logits_ntv, axis=-1)
    return jnp.take_along_axis(logp_ntv, seqs_nt[..., None], axis=-1)[..., 0]
