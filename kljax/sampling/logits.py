"""From one decode step's logits to a token: the sampler's settings, the distribution it draws from
(repetition penalty, then temperature, then top-k, then top-p, then min-p, as in transformers), the draw
itself, and the log-prob and entropy of what was drawn. Pure functions of [R, V] float32 logits;
`kljax.sampling` runs them in its decode loop, and the tests check them against exact enumeration.

Log-probs are those of the sampled token under the exact distribution it was drawn from (logits
penalized on the row's seen tokens, divided by the temperature, restricted to the top-k, then to the
top-p nucleus, then to the tokens with at least min_p times the most likely token's probability,
renormalized); greedy decoding takes the argmax of the penalized logits but reports the model's own
temperature-1 log-prob and entropy (no penalty) instead.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

# ---------------------------------------------------------------------------------------- params


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Static, hashable sampler settings (a jit static argument: each distinct value compiles once).

    max_new_tokens: response length N (the fixed buffer size).
    temperature: logits are divided by it; 0 means greedy.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    top_k: keep the k most likely tokens; 0 disables it.
    min_p: keep the tokens whose probability is at least min_p times the most likely one's (after
      temperature, top-k and top-p); 0 disables it.
    greedy: argmax decoding (temperature, top_p, top_k, min_p ignored; repetition_penalty applies).
    stop_token_ids: a response ends at the first of these (kept, masked after).
    stop_sequences: token-id sequences (each of 2 or more ids); a response also ends at the token
      completing the first occurrence of one of them inside the response (kept, masked after). A
      sequence of one id is moved into stop_token_ids.
    n: samples per prompt.
    entropy: also return the entropy of every step's distribution (`SampleResult.response_entropy_rn`).
    chunk: prompts per sampler chunk: the B prompts are generated in B / chunk strided groups one after
      another, so the KV cache holds chunk * n rows at a time (`kljax.sampling.sampler`); 0: all at once.
    greedy_first: the first of each prompt's n rows (rows r with r % n == 0) decodes greedily (its
      log-prob and entropy the model's temperature-1 ones), the other n - 1 are drawn as above: an
      evaluation's greedy and sampled answers from one prefill.
    repetition_penalty: > 0; every token id already in the row (its prompt and its response so far)
      has its logit z replaced by z / penalty if z > 0 else z * penalty, before temperature
      (transformers' RepetitionPenaltyLogitsProcessor, `penalize_repeats`); 1 = off.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    min_p: float = 0.0
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    entropy: bool = False
    chunk: int = 0
    greedy_first: bool = False
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        stops = self.stop_token_ids
        if isinstance(stops, int | np.integer):
            stops = (stops,)
        try:
            stops = tuple(sorted({int(s) for s in stops}))
        except TypeError as e:
            raise ValueError(f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}") from e
        try:
            sequences = tuple(tuple(int(t) for t in seq) for seq in self.stop_sequences)
        except TypeError as e:
            raise ValueError(f"stop_sequences must be sequences of ints, got {self.stop_sequences!r}") from e
        if any(not seq or min(seq) < 0 for seq in sequences):
            raise ValueError(f"stop_sequences must be non-empty sequences of ids >= 0, got {sequences}")
        stops = tuple(sorted(set(stops) | {seq[0] for seq in sequences if len(seq) == 1}))
        object.__setattr__(self, "stop_sequences", tuple(sorted({seq for seq in sequences if len(seq) > 1})))
        object.__setattr__(self, "stop_token_ids", stops)
        if any(s < 0 for s in stops):
            raise ValueError(f"stop_token_ids must be non-negative, got {stops}")
        if not isinstance(self.max_new_tokens, int | np.integer) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not isinstance(self.top_k, int | np.integer) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.n, int | np.integer) or self.n < 1:
            raise ValueError(f"n (samples per prompt) must be an int >= 1, got {self.n!r}")
        if not isinstance(self.chunk, int | np.integer) or self.chunk < 0:
            raise ValueError(f"chunk (prompts per sampler chunk) must be an int >= 0 (0 = all), got {self.chunk!r}")
        bad_penalty = f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty!r}"
        try:
            penalty = float(self.repetition_penalty)
        except (TypeError, ValueError) as e:
            raise ValueError(bad_penalty) from e
        if not math.isfinite(penalty) or penalty <= 0:
            raise ValueError(bad_penalty)
        object.__setattr__(self, "repetition_penalty", penalty)
        object.__setattr__(self, "chunk", int(self.chunk))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "min_p", float(self.min_p))

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def penalizes_repeats(self) -> bool:
        """Whether the draw needs each row's seen tokens (`repetition_penalty` != 1)."""
        return self.repetition_penalty != 1.0


# ---------------------------------------------------------------------------------------- repetition


def penalize_repeats(logits_rv: jax.Array, seen_rv: jax.Array, penalty: float) -> jax.Array:
    """Repetition penalty on float32 logits [R, V]: where seen_rv (bool [R, V]) is True, z becomes
    z * penalty if z < 0 else z / penalty (transformers' RepetitionPenaltyLogitsProcessor)."""
    logits_rv = logits_rv.astype(jnp.float32)
    penalized_rv = jnp.where(logits_rv < 0, logits_rv * penalty, logits_rv / penalty)
    return jnp.where(seen_rv, penalized_rv, logits_rv)


def seen_from_prompts(tokens_bp: jax.Array, mask_bp: jax.Array, vocab: int) -> jax.Array:
    """bool [B, V]: the ids of each row's real prompt tokens (mask True; padding ignored)."""
    b = tokens_bp.shape[0]
    ids_bp = jnp.where(mask_bp, tokens_bp, vocab)  # padding -> out of range, dropped
    return jnp.zeros((b, vocab), bool).at[jnp.arange(b)[:, None], ids_bp].set(True, mode="drop")


def mark_seen(seen_rv: jax.Array, tokens_r: jax.Array) -> jax.Array:
    """seen_rv with each row's token set (elementwise, so it shards like the rows)."""
    return seen_rv | (jnp.arange(seen_rv.shape[1], dtype=jnp.int32)[None, :] == tokens_r[:, None])


def _penalized(logits_rv: jax.Array, sampling: SamplingParams, seen_rv: jax.Array | None) -> jax.Array:
    """Float32 logits with `sampling.repetition_penalty` applied on seen_rv (which it then needs)."""
    logits_rv = logits_rv.astype(jnp.float32)
    if not sampling.penalizes_repeats:
        return logits_rv
    if seen_rv is None:
        raise ValueError(f"repetition_penalty={sampling.repetition_penalty} needs the rows' seen tokens (seen_rv)")
    return penalize_repeats(logits_rv, seen_rv, sampling.repetition_penalty)


# ---------------------------------------------------------------------------------------- sampling

_CHUNK = 256  # inverse-CDF sampling first picks a chunk of this many candidates, then a token in it


def _first_index_of(x_rc: jax.Array, value_r: jax.Array) -> jax.Array:
    """Per row, the first index of the last axis where x equals value (C if none), int32."""
    c = x_rc.shape[-1]
    return jnp.min(jnp.where(x_rc == value_r[:, None], jnp.arange(c, dtype=jnp.int32), c), axis=-1).astype(jnp.int32)


def _first_argmax(x_rc: jax.Array) -> jax.Array:
    """argmax over the last axis (first index on ties) as two plain reductions, which XLA CPU
    vectorizes (its variadic argmax reduce does not)."""
    return _first_index_of(x_rc, jnp.max(x_rc, axis=-1))


def _chunked_argmax(x_rv: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(argmax, max) over the last axis, first index on ties, in two levels: the max of each chunk of
    _CHUNK, the first chunk holding the overall max, the first index in it. One full pass over
    x instead of two (a max, then an index select over all V: 2 ms a step at 32 x 49152 on CPU)."""
    r, v = x_rv.shape
    if v <= 2 * _CHUNK:
        best_r = jnp.max(x_rv, axis=-1)
        return _first_index_of(x_rv, best_r), best_r
    pad = -v % _CHUNK
    x_rnk = jnp.pad(x_rv, ((0, 0), (0, pad)), constant_values=-jnp.inf).reshape(r, -1, _CHUNK)
    j_r, best_r = _chunked_argmax(jnp.max(x_rnk, axis=-1))
    x_rk = jnp.take_along_axis(x_rnk, j_r[:, None, None], axis=1)[:, 0]
    return j_r * _CHUNK + _first_index_of(x_rk, best_r), best_r


def _top_p_threshold(probs_rv: jax.Array, top_p: float) -> jax.Array:
    """Per row, the largest probability t with sum(p >= t) >= top_p: keeping tokens with p >= t is
    the nucleus (ties at the boundary kept). Exact bisection on the float bits (31 passes, no sort)."""
    bits_rv = jax.lax.bitcast_convert_type(probs_rv, jnp.int32)  # monotone for p >= 0

    def body(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo + 1) // 2
        ok = jnp.sum(jnp.where(bits_rv >= mid[:, None], probs_rv, 0.0), axis=-1) >= top_p
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

    lo = jnp.zeros(probs_rv.shape[:1], jnp.int32)
    lo, _ = jax.lax.fori_loop(0, 31, body, (lo, jnp.max(bits_rv, axis=-1)))
    return jax.lax.bitcast_convert_type(lo, jnp.float32)


def candidate_logits(
    logits_rv: jax.Array, sampling: SamplingParams, seen_rv: jax.Array | None = None
) -> tuple[jax.Array, jax.Array | None]:
    """The distribution sampled from, as candidate logits with excluded tokens at -inf.

    Order as in transformers: repetition penalty (on seen_rv, bool [R, V]; needed only when the
    penalty is on), then temperature, top-k, top-p, min-p. Returns (logits_rc, ids_rc): with top-k
    the C = k candidates are the k best (sorted) and ids_rc maps them to vocab ids; otherwise all V
    logits and ids None.
    """
    logits_rc, ids_rc = _top_k_top_p(_penalized(logits_rv, sampling, seen_rv), sampling)
    if sampling.min_p > 0.0:
        # p_i >= min_p * p_max  <=>  z_i >= z_max + log(min_p) on the (tempered) logits: the ratio is
        # unchanged by the renormalization after top-k/top-p, and the most likely token always stays.
        floor_r1 = jnp.max(logits_rc, axis=-1, keepdims=True) + math.log(sampling.min_p)
        logits_rc = jnp.where(logits_rc >= floor_r1, logits_rc, -jnp.inf)
    return logits_rc, ids_rc


def _top_k_top_p(logits_rv: jax.Array, sampling: SamplingParams) -> tuple[jax.Array, jax.Array | None]:
    """`candidate_logits` before min-p: temperature, top-k, top-p."""
    logits_rv = logits_rv.astype(jnp.float32) / sampling.temperature
    v = logits_rv.shape[-1]
    k = min(sampling.top_k, v)
    if k:
        logits_rc, ids_rc = jax.lax.top_k(logits_rv, k)  # sorted, best first
        if sampling.top_p < 1.0:
            probs_rc = jax.nn.softmax(logits_rc, axis=-1)
            keep_rc = (jnp.cumsum(probs_rc, axis=-1) - probs_rc < sampling.top_p).at[:, 0].set(True)
            logits_rc = jnp.where(keep_rc, logits_rc, -jnp.inf)
        return logits_rc, ids_rc
    if sampling.top_p < 1.0:
        probs_rv = jax.nn.softmax(logits_rv, axis=-1)
        keep_rv = probs_rv >= _top_p_threshold(probs_rv, sampling.top_p)[:, None]
        logits_rv = jnp.where(keep_rv, logits_rv, -jnp.inf)
    return logits_rv, None


def inverse_cdf_sample(logits_rc: jax.Array, u_r: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Index i ~ softmax(logits_rc) per row from uniforms u_r in [0, 1), and log softmax at i.

    One uniform per row instead of C Gumbel draws: the cumulative mass is searched in two levels
    (chunks of _CHUNK, then within the chosen chunk). A -inf (zero-mass) candidate is never drawn.
    """
    r, c = logits_rc.shape
    chunk = _CHUNK if c > 2 * _CHUNK else c
    pad = -c % chunk
    if pad:
        logits_rc = jnp.pad(logits_rc, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    nc = logits_rc.shape[1] // chunk
    top_r1 = jnp.max(logits_rc, axis=-1, keepdims=True)
    e_rnk = jnp.exp(logits_rc - top_r1).reshape(r, nc, chunk)
    mass_rn = jnp.sum(e_rnk, axis=-1)
    cum_rn = jnp.cumsum(mass_rn, axis=-1)
    total_r = cum_rn[:, -1]
    target_r = u_r * total_r
    # First chunk whose cumulative mass exceeds the target (it has positive mass); rounding at the
    # very top falls back to the last chunk with mass.
    j_r = jnp.sum(cum_rn <= target_r[:, None], axis=-1).astype(jnp.int32)
    last_j_r = (nc - 1 - _first_argmax((mass_rn[:, ::-1] > 0).astype(jnp.int32))).astype(jnp.int32)
    j_r = jnp.where(j_r < nc, j_r, last_j_r)
    e_rk = jnp.take_along_axis(e_rnk, j_r[:, None, None], axis=1)[:, 0]
    base_r = jnp.where(j_r > 0, jnp.take_along_axis(cum_rn, jnp.maximum(j_r - 1, 0)[:, None], axis=1)[:, 0], 0.0)
    i_r = jnp.sum(base_r[:, None] + jnp.cumsum(e_rk, axis=-1) <= target_r[:, None], axis=-1).astype(jnp.int32)
    last_i_r = (chunk - 1 - _first_argmax((e_rk[:, ::-1] > 0).astype(jnp.int32))).astype(jnp.int32)
    i_r = jnp.where(i_r < chunk, i_r, last_i_r)
    index_r = j_r * chunk + i_r
    picked_r = jnp.take_along_axis(logits_rc, index_r[:, None], axis=1)[:, 0]
    return index_r, picked_r - top_r1[:, 0] - jnp.log(total_r)


def sample_logits(
    logits_rv: jax.Array, key: jax.Array, sampling: SamplingParams, seen_rv: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Draw one token per row from float32 logits [R, V]: (tokens int32 [R], log-probs float32 [R],
    entropy float32 [R] when `sampling.entropy`, else None). seen_rv bool [R, V]: the tokens the
    repetition penalty hits (needed only when it is on).

    The log-prob and entropy are those of the distribution drawn from (see the module docstring;
    greedy reports the model's temperature-1 unpenalized ones). The candidates are formed once.
    """
    logits_rv = logits_rv.astype(jnp.float32)
    if sampling.is_greedy and not sampling.penalizes_repeats:  # one max for argmax, normalizer, entropy
        tokens_r, best_r = _chunked_argmax(logits_rv)
        shifted_rv = logits_rv - best_r[:, None]
        logp_r = -jnp.log(jnp.sum(jnp.exp(shifted_rv), axis=-1))
        return tokens_r, logp_r, _entropy_of_shifted(shifted_rv) if sampling.entropy else None
    if sampling.is_greedy:  # the argmax of the penalized logits, the model's own log-prob of it
        tokens_r, _ = _chunked_argmax(_penalized(logits_rv, sampling, seen_rv))
        logp_r = sampling_logprobs(logits_rv, tokens_r, sampling)
        return tokens_r, logp_r, _entropy(logits_rv) if sampling.entropy else None
    logits_rc, ids_rc = candidate_logits(logits_rv, sampling, seen_rv)
    u_r = jax.random.uniform(key, logits_rv.shape[:1], jnp.float32)
    choice_r, logp_r = inverse_cdf_sample(logits_rc, u_r)
    tokens_r = choice_r if ids_rc is None else jnp.take_along_axis(ids_rc, choice_r[:, None], axis=-1)[:, 0]
    entropy_r = _entropy(logits_rc) if sampling.entropy else None
    if sampling.greedy_first:  # row r % n == 0 of each prompt: the greedy draw (see SamplingParams)
        greedy_r = jnp.arange(logits_rv.shape[0]) % sampling.n == 0
        g_tokens_r, g_logp_r, g_entropy_r = sample_logits(logits_rv, key, dataclasses.replace(sampling, greedy=True))
        tokens_r = jnp.where(greedy_r, g_tokens_r, tokens_r)
        logp_r = jnp.where(greedy_r, g_logp_r, logp_r)
        entropy_r = None if entropy_r is None else jnp.where(greedy_r, g_entropy_r, entropy_r)
    return tokens_r.astype(jnp.int32), logp_r, entropy_r


def sampling_logprobs(
    logits_rv: jax.Array, tokens_r: jax.Array, sampling: SamplingParams, seen_rv: jax.Array | None = None
) -> jax.Array:
    """log q(token) [R] under the sampler's distribution for these logits (-inf if excluded); seen_rv
    as in `sample_logits`. Greedy: the model's temperature-1 unpenalized log-prob."""
    logits_rv = logits_rv.astype(jnp.float32)
    if sampling.is_greedy:
        return jnp.take_along_axis(jax.nn.log_softmax(logits_rv, -1), tokens_r[:, None], -1)[:, 0]
    logits_rc, ids_rc = candidate_logits(logits_rv, sampling, seen_rv)
    logq_rc = jax.nn.log_softmax(logits_rc, axis=-1)
    if ids_rc is None:
        return jnp.take_along_axis(logq_rc, tokens_r[:, None], -1)[:, 0]
    return jnp.max(jnp.where(ids_rc == tokens_r[:, None], logq_rc, -jnp.inf), axis=-1)


def _entropy_of_shifted(shifted_rc: jax.Array) -> jax.Array:
    """-sum q log q [R] of q = softmax(logits) given logits minus their row max (-inf = excluded)."""
    e_rc = jnp.exp(shifted_rc)  # 0 at excluded candidates
    total_r = jnp.sum(e_rc, axis=-1)
    return jnp.log(total_r) - jnp.sum(jnp.where(e_rc > 0, e_rc * shifted_rc, 0.0), axis=-1) / total_r


def _entropy(logits_rc: jax.Array) -> jax.Array:
    return _entropy_of_shifted(logits_rc - jnp.max(logits_rc, axis=-1, keepdims=True))


def sampling_entropy(logits_rv: jax.Array, sampling: SamplingParams, seen_rv: jax.Array | None = None) -> jax.Array:
    """Entropy [R] float32 of the distribution the sampler draws from at these logits: -sum q log q
    over the candidates (repetition penalty on seen_rv, temperature, top-k, top-p, min-p applied).
    Greedy reports the model's own temperature-1 unpenalized entropy, as it reports the model's
    log-probs. (`sample_logits` returns the same alongside its draw.)"""
    logits_rv = logits_rv.astype(jnp.float32)
    return _entropy(logits_rv if sampling.is_greedy else candidate_logits(logits_rv, sampling, seen_rv)[0])
