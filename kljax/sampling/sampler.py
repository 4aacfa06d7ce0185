"""The jitted sampler: one batched prefill, then a `lax.while_loop` decode over a KV cache.

    result = generate(params, config, prompt_tokens_bp, prompt_mask_bp, key, SamplingParams(...))

Shapes: B prompts, n samples per prompt (R = B * n response rows), P = the prompt length bucket,
N = `max_new_tokens`, V = vocab. Row r of every [R, ...] output belongs to prompt r // n.

* Prompts may be left- or right-padded (any mask whose valid tokens are contiguous); they are
  left-aligned on the host, trimmed to the longest prompt and left-padded to `bucket_length(...)`,
  so one compiled program serves every batch of the same (B, P bucket, sampling params).
* Prefill runs the B prompts once; the cache rows and last logits are then repeated n times.
* The decode loop is a `lax.while_loop` over a `DecodeState` of fixed-size buffers. It stops when
  every row has emitted a stop token (or completed a stop sequence: `SamplingParams.stop_sequences`)
  or after N tokens. Rows that stopped keep sampling (the batch runs anyway); everything after a
  row's first stop is masked once, after the loop. The stop token itself (a stop sequence's last
  token) is kept in the response and its mask is True. Masking only ends a response early, so the
  log-probs of the tokens kept are unchanged and still equal the teacher-forced ones.
* Log-probs are those of the sampled token under the exact distribution it was drawn from: logits
  under the repetition penalty (`SamplingParams.repetition_penalty`, on the ids of the row's real
  prompt tokens and of its tokens sampled so far: `DecodeState.seen_rv`), divided by the temperature,
  restricted to the top-k, then to the top-p nucleus, then by min-p, renormalized.
  With `greedy` (or temperature 0) the distribution is a point mass (the argmax of the penalized
  logits), so the sampler reports the model's own log-prob instead (temperature 1, no penalty, no
  truncation), which is what an off-policy correction needs. At temperature 1 with no truncation
  and no penalty they equal teacher-forced log-probs (`response_logprobs`) to float32 rounding.

The decode step itself lives in `kljax.sampling.step` (attention over the filled cache prefix only),
the draw from each step's logits (and its log-prob and entropy) in `kljax.sampling.logits`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from kljax.models.config import ModelConfig
from kljax.models.transformer import Params, positions_from_mask, token_logprobs
from kljax.parallel import sharding as sharding_lib
from kljax.sampling import step as step_lib
from kljax.sampling.chunks import join_rows, num_chunks, split_prompts
from kljax.sampling.logits import (  # noqa: F401  (re-exported: the sampler's public API)
    SamplingParams,
    mark_seen,
    sample_logits,
    sampling_entropy,
    sampling_logprobs,
    seen_from_prompts,
)
from kljax.sampling.step import constrain_batch, prefill

DEFAULT_PROMPT_BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS) -> int:
    """The smallest bucket >= n; beyond the largest bucket, n rounded up to a multiple of it.

    An empty `buckets` means no bucketing (returns n).
    """
    if n < 1:
        raise ValueError(f"bucket_length needs n >= 1, got {n}")
    ordered = sorted(int(b) for b in buckets)
    if any(b < 1 for b in ordered):
        raise ValueError(f"buckets must be positive, got {tuple(buckets)}")
    if not ordered:
        return n
    for b in ordered:
        if n <= b:
            return b
    return -(-n // ordered[-1]) * ordered[-1]


# ---------------------------------------------------------------------------------------- state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """The `lax.while_loop` carry. R rows, N = max_new_tokens.

    step: int32 [] tokens sampled so far; tokens_rn int32 [R, N]; logp_rn float32 [R, N];
    entropy_rn float32 [R, N] (None unless `SamplingParams.entropy`); seen_rv bool [R, V]: the ids in
    the row's real prompt tokens and its tokens sampled so far (None, not carried, unless the
    repetition penalty is on); done_r bool [R] (a stop token was sampled); positions_r int32 [R] (RoPE
    position of the last sampled token); cache: the KV cache (see `kljax.sampling.step`); key: the
    PRNG key of the run.
    """

    step: jax.Array
    tokens_rn: jax.Array
    logp_rn: jax.Array
    entropy_rn: jax.Array | None
    seen_rv: jax.Array | None
    done_r: jax.Array
    positions_r: jax.Array
    cache: Any  # step_lib.DecodeCache (CPU kernels) or the model's KVCache (plain)
    key: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleResult:
    """What the sampler returns. R = B * n rows (row r is a sample of prompt r // n), N new tokens,
    P the prompt bucket, S = P + N.

    response_tokens_rn int32 [R, N]: sampled ids, pad id after the stop token / past the end.
    response_mask_rn bool [R, N]: True up to and including the first stop token.
    response_logprobs_rn float32 [R, N]: sampler log-probs (0 where masked).
    response_entropy_rn float32 [R, N]: the entropy of each step's distribution (`sampling_entropy`;
    0 where masked), or None unless `SamplingParams.entropy`.
    response_lengths_r int32 [R]; stopped_r bool [R]: the response ends with a stop token or sequence.
    prompt_tokens_rp, prompt_mask_rp [R, P]: the left-padded prompts, repeated n times.
    sequence_tokens_rs, sequence_mask_rs, sequence_positions_rs [R, S]: prompt + response, to
    teacher-force (`response_logprobs`). num_steps int32 []: decode steps actually run.
    """

    response_tokens_rn: jax.Array
    response_mask_rn: jax.Array
    response_logprobs_rn: jax.Array
    response_entropy_rn: jax.Array | None
    response_lengths_r: jax.Array
    stopped_r: jax.Array
    prompt_tokens_rp: jax.Array
    prompt_mask_rp: jax.Array
    sequence_tokens_rs: jax.Array
    sequence_mask_rs: jax.Array
    sequence_positions_rs: jax.Array
    num_steps: jax.Array

    @property
    def prompt_length(self) -> int:
        """P, the (bucketed) prompt width; response token j sits at sequence index P + j."""
        return self.prompt_tokens_rp.shape[1]


# ---------------------------------------------------------------------------------------- the loop


def _pad_id(config: ModelConfig) -> int:
    return int(config.pad_token_id) if config.pad_token_id is not None else 0


def sequence_ends_rn(tokens_rn: jax.Array, sequences: tuple[tuple[int, ...], ...]) -> jax.Array:
    """bool [R, N]: position j ends an occurrence of one of `sequences` (token ids) within the row."""
    ends_rn = jnp.zeros(tokens_rn.shape, bool)
    for seq in sequences:
        hit_rn = jnp.ones(tokens_rn.shape, bool)
        for i, token in enumerate(seq):  # token i of the sequence sits at j - (L - 1 - i)
            shift = len(seq) - 1 - i
            shifted_rn = jnp.pad(tokens_rn, ((0, 0), (shift, 0)), constant_values=-1)[:, : tokens_rn.shape[1]]
            hit_rn &= shifted_rn == token
        ends_rn |= hit_rn
    return ends_rn


def _sequence_ended_r(tokens_rn: jax.Array, step: jax.Array, sequences: tuple[tuple[int, ...], ...]) -> jax.Array:
    """bool [R]: the token written at `step` completes one of `sequences` (token ids)."""
    done_r = jnp.zeros(tokens_rn.shape[:1], bool)
    for seq in sequences:
        n = len(seq)
        window_rl = jax.lax.dynamic_slice_in_dim(tokens_rn, jnp.maximum(step - n + 1, 0), n, axis=1)
        done_r |= (step >= n - 1) & jnp.all(window_rl == jnp.asarray(seq, jnp.int32)[None, :], axis=-1)
    return done_r


@partial(jax.jit, static_argnames=("config", "sampling", "mesh"))
def _generate_jit(
    params: Params,
    prompt_tokens_bp: jax.Array,
    prompt_mask_bp: jax.Array,
    key: jax.Array,
    *,
    config: ModelConfig,
    sampling: SamplingParams,
    mesh: Mesh | None,
) -> SampleResult:
    """All B prompts at once, or with `sampling.chunk` in C = B / chunk strided chunks
    (`kljax.sampling.chunks`) one after another (`lax.map`), chunk c drawing with
    `fold_in(key, c)`. Greedy tokens and all log-probs are those of one batch: rows never interact."""
    weights = step_lib.step_weights(params, config, mesh)  # once, outside the chunks
    b = prompt_tokens_bp.shape[0]
    c = num_chunks(b, sampling.chunk)
    if c == 1:
        return _generate_rows(params, weights, prompt_tokens_bp, prompt_mask_bp, key, config, sampling, mesh)

    def one(args: tuple[jax.Array, jax.Array, jax.Array]) -> SampleResult:
        tokens_bp, mask_bp, i = args
        return _generate_rows(params, weights, tokens_bp, mask_bp, jax.random.fold_in(key, i), config, sampling,
                              mesh)

    out = jax.lax.map(one, (split_prompts(prompt_tokens_bp, c, mesh), split_prompts(prompt_mask_bp, c, mesh),
                            jnp.arange(c)))
    return jax.tree.map(lambda x: join_rows(x, c, b, mesh), out)



def _generate_rows(
    params: Params,
    weights: Any,
    prompt_tokens_bp: jax.Array,
    prompt_mask_bp: jax.Array,
    key: jax.Array,
    config: ModelConfig,
    sampling: SamplingParams,
    mesh: Mesh | None,
) -> SampleResult:
    """The sampler on B prompts at once (traced inside `_generate_jit`); `weights`: `step_weights`."""
    b, p = prompt_tokens_bp.shape
    n, big_n = sampling.n, sampling.max_new_tokens
    r = b * n
    positions_bp = positions_from_mask(prompt_mask_bp)

    logits_bv, cache = prefill(params, prompt_tokens_bp, prompt_mask_bp, positions_bp, config=config)
    # n samples per prompt: repeat the prefilled rows, not the prefill.
    cache = step_lib.constrain_cache(step_lib.repeat_rows(cache, n), mesh)
    logits_rv = constrain_batch(jnp.repeat(logits_bv, n, axis=0), mesh)
    stop_ids = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)

    seen_rv = None
    if sampling.penalizes_repeats:  # each row's own set: its prompt's ids, then its own samples
        seen_bv = seen_from_prompts(prompt_tokens_bp, prompt_mask_bp, logits_rv.shape[1])
        seen_rv = constrain_batch(jnp.repeat(seen_bv, n, axis=0), mesh)
    tokens0_r, logp0_r, entropy0_r = sample_logits(logits_rv, jax.random.fold_in(key, 0), sampling, seen_rv)
    entropy_rn = None
    if sampling.entropy:
        entropy_rn = constrain_batch(jnp.zeros((r, big_n), jnp.float32).at[:, 0].set(entropy0_r), mesh)
    state = DecodeState(
        step=jnp.ones((), jnp.int32),
        tokens_rn=constrain_batch(jnp.zeros((r, big_n), jnp.int32).at[:, 0].set(tokens0_r), mesh),
        logp_rn=constrain_batch(jnp.zeros((r, big_n), jnp.float32).at[:, 0].set(logp0_r), mesh),
        entropy_rn=entropy_rn,
        seen_rv=None if seen_rv is None else mark_seen(seen_rv, tokens0_r),
        done_r=jnp.isin(tokens0_r, stop_ids),
        positions_r=jnp.repeat(positions_bp[:, -1], n) + 1,
        cache=cache,
        key=key,
    )

    def step_fn(state: DecodeState, logits_rv: jax.Array, cache: Any) -> DecodeState:
        tok_r, logp_r, entropy_r = sample_logits(logits_rv, jax.random.fold_in(state.key, state.step), sampling,
                                                 state.seen_rv)
        entropy_rn = state.entropy_rn
        if entropy_rn is not None:
            entropy_rn = jax.lax.dynamic_update_index_in_dim(entropy_rn, entropy_r, state.step, 1)
        tokens_rn = jax.lax.dynamic_update_index_in_dim(state.tokens_rn, tok_r, state.step, 1)
        done_r = state.done_r | jnp.isin(tok_r, stop_ids)
        if sampling.stop_sequences:
            done_r |= _sequence_ended_r(tokens_rn, state.step, sampling.stop_sequences)
        return DecodeState(
            step=state.step + 1,
            tokens_rn=tokens_rn,
            logp_rn=jax.lax.dynamic_update_index_in_dim(state.logp_rn, logp_r, state.step, 1),
            entropy_rn=entropy_rn,
            seen_rv=None if state.seen_rv is None else mark_seen(state.seen_rv, tok_r),
            done_r=done_r,
            positions_r=state.positions_r + 1,
            cache=cache,
            key=state.key,
        )

    state = step_lib.decode_loop(
        weights, state, step_fn, prompt_len=p, config=config, max_new_tokens=big_n, mesh=mesh
    )

    # Mask everything after the first stop token (or stop sequence's last token), once.
    j_n = jnp.arange(big_n)
    ran_rn = j_n[None, :] < state.step
    is_stop_rn = jnp.isin(state.tokens_rn, stop_ids)
    if sampling.stop_sequences:
        is_stop_rn |= sequence_ends_rn(state.tokens_rn, sampling.stop_sequences)
    is_stop_rn &= ran_rn
    stopped_r = jnp.any(is_stop_rn, axis=-1)
    first_stop_r = jnp.where(stopped_r, jnp.argmax(is_stop_rn, axis=-1), big_n)
    mask_rn = ran_rn & (j_n[None, :] <= first_stop_r[:, None])
    tokens_rn = jnp.where(mask_rn, state.tokens_rn, _pad_id(config))
    logp_rn = jnp.where(mask_rn, state.logp_rn, 0.0)
    entropy_rn = None if state.entropy_rn is None else jnp.where(mask_rn, state.entropy_rn, 0.0)

    prompt_tokens_rp = jnp.repeat(prompt_tokens_bp, n, axis=0)
    prompt_mask_rp = jnp.repeat(prompt_mask_bp, n, axis=0)
    seq_tokens = jnp.concatenate([prompt_tokens_rp, tokens_rn], axis=1)
    seq_mask = jnp.concatenate([prompt_mask_rp, mask_rn], axis=1)
    return SampleResult(
        response_tokens_rn=tokens_rn,
        response_mask_rn=mask_rn,
        response_logprobs_rn=logp_rn,
        response_entropy_rn=entropy_rn,
        response_lengths_r=mask_rn.sum(-1).astype(jnp.int32),
        stopped_r=stopped_r,
        prompt_tokens_rp=prompt_tokens_rp,
        prompt_mask_rp=prompt_mask_rp,
        sequence_tokens_rs=seq_tokens,
        sequence_mask_rs=seq_mask,
        sequence_positions_rs=positions_from_mask(seq_mask),
        num_steps=state.step,
    )


# ---------------------------------------------------------------------------------------- entry


def prepare_prompts(
    prompt_tokens_bp: np.ndarray | jax.Array,
    prompt_mask_bp: np.ndarray | jax.Array | None,
    *,
    buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
    pad_id: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Host-side: left-align (left- or right-padded input), trim and left-pad to the length bucket.

    Returns tokens int32 [B, P] and mask bool [B, P] with P = bucket_length(longest prompt).
    Raises ValueError for a wrongly shaped batch, an empty prompt, or a mask with holes.
    """
    tokens = np.asarray(prompt_tokens_bp)
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError(f"prompt tokens must be a non-empty [B, P] array, got shape {tokens.shape}")
    mask = np.ones(tokens.shape, bool) if prompt_mask_bp is None else np.asarray(prompt_mask_bp).astype(bool)
    if mask.shape != tokens.shape:
        raise ValueError(f"prompt mask shape {mask.shape} differs from prompt tokens shape {tokens.shape}")
    lengths = mask.sum(axis=1)
    if (lengths == 0).any():
        raise ValueError(f"empty prompt (no valid tokens) in row(s) {np.flatnonzero(lengths == 0).tolist()}")
    first, last = mask.argmax(axis=1), mask.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)
    if (last - first + 1 != lengths).any():
        raise ValueError("each prompt's valid tokens must be contiguous (left or right padding, no holes)")
    order = np.argsort(mask, axis=1, kind="stable")  # padding first, tokens after, in order
    tokens = np.take_along_axis(tokens, order, axis=1)
    p = bucket_length(int(lengths.max()), buckets)
    out_tokens = np.full((tokens.shape[0], p), pad_id, np.int32)
    out_mask = np.zeros((tokens.shape[0], p), bool)
    width = min(p, tokens.shape[1])
    out_tokens[:, p - width:] = tokens[:, tokens.shape[1] - width:]
    out_mask[:, p - width:] = np.sort(mask, axis=1)[:, tokens.shape[1] - width:]
    out_tokens[~out_mask] = pad_id
    return out_tokens, out_mask


def generate(
    params: Params,
    model_config: ModelConfig,
    prompt_tokens_bp: np.ndarray | jax.Array,
    prompt_mask_bp: np.ndarray | jax.Array | None,
    key: jax.Array,
    sampling: SamplingParams,
    *,
    mesh: Mesh | None = None,
    prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
) -> SampleResult:
    """Sample `sampling.n` responses of `sampling.max_new_tokens` tokens for each of B prompts.

    prompt_tokens_bp int [B, P], prompt_mask_bp bool [B, P] (None = no padding; left or right
    padding), key: a PRNG key. Prompts are host data (the same on every process). With `mesh`,
    the batch is sharded over its (data, fsdp) axes; B must be divisible by their size.
    Compiles once per (B, prompt bucket, sampling params, config, mesh). See `SampleResult`.
    """
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    tokens_bp, mask_bp = prepare_prompts(
        prompt_tokens_bp, prompt_mask_bp, buckets=prompt_buckets, pad_id=_pad_id(model_config)
    )
    longest = int(mask_bp.sum(axis=1).max())
    if longest + sampling.max_new_tokens > model_config.max_position_embeddings:
        raise ValueError(
            f"a prompt of {longest} tokens plus max_new_tokens={sampling.max_new_tokens} exceeds the model's "
            f"context of max_position_embeddings={model_config.max_position_embeddings} tokens"
        )
    bad = tokens_bp[mask_bp]
    if bad.size and (bad.min() < 0 or bad.max() >= model_config.vocab_size):
        raise ValueError(f"prompt token ids must be in [0, {model_config.vocab_size}), got [{bad.min()}, {bad.max()}]")
    if any(s >= model_config.vocab_size for s in sampling.stop_token_ids):
        raise ValueError(f"stop_token_ids {sampling.stop_token_ids} beyond vocab_size={model_config.vocab_size}")
    if any(t >= model_config.vocab_size for seq in sampling.stop_sequences for t in seq):
        raise ValueError(f"stop_sequences {sampling.stop_sequences} hold ids beyond "
                         f"vocab_size={model_config.vocab_size}")
    chunks = num_chunks(tokens_bp.shape[0], sampling.chunk)
    if mesh is not None:
        shards = math.prod(mesh.shape[a] for a in ("data", "fsdp") if a in mesh.shape)
        if tokens_bp.shape[0] % shards:
            raise ValueError(
                f"batch of {tokens_bp.shape[0]} prompts does not divide over the mesh's data axes ({shards} shards)"
            )
        if (tokens_bp.shape[0] // chunks) % shards:
            raise ValueError(f"sampler chunk of {tokens_bp.shape[0] // chunks} prompts does not divide over the "
                             f"mesh's data axes ({shards} shards)")
        batch = sharding_lib.data_sharding(mesh)
        tokens_in = sharding_lib.device_put_host(tokens_bp, batch)
        mask_in = sharding_lib.device_put_host(mask_bp, batch)
    else:
        tokens_in, mask_in = jnp.asarray(tokens_bp), jnp.asarray(mask_bp)
    return _generate_jit(params, tokens_in, mask_in, key, config=model_config, sampling=sampling, mesh=mesh)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to tokens_bt int32 [B, T] and mask_bt bool [B, T]."""
    t = max(len(s) for s in sequences)
    tokens = np.full((len(sequences), t), pad_id, np.int32)
    mask = np.zeros((len(sequences), t), bool)
    for b, s in enumerate(sequences):
        if len(s):
            tokens[b, t - len(s):] = s
            mask[b, t - len(s):] = True
    return tokens, mask


def greedy_continuations(
    params: Params, config: ModelConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int,
    stop_token_ids: Sequence[int] = (), pad_id: int = 0, mesh: Mesh | None = None,
) -> list[list[int]]:
    """Greedy continuation of each prompt by the sampler: up to `max_new_tokens` ids per row,
    ending at (and including) the first stop token if one is produced."""
    tokens, mask = left_pad(prompts, pad_id)
    sp = SamplingParams(max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=tuple(stop_token_ids))
    out = generate(params, config, tokens, mask, jax.random.PRNGKey(0), sp, mesh=mesh)
    ids, keep = np.asarray(out.response_tokens_rn), np.asarray(out.response_mask_rn)
    return [row[m].tolist() for row, m in zip(ids, keep, strict=True)]


def response_logprobs(
    params: Params, result: SampleResult, *, config: ModelConfig, temperature: float = 1.0
) -> jax.Array:
    """Teacher-forced log-probs [R, N] of the sampled responses (0 where masked), by one forward
    pass over `result.sequence_*`: what the trainer computes, to compare with the sampler's."""
    p = result.prompt_length
    tokens = result.sequence_tokens_rs
    targets = jnp.roll(tokens, -1, axis=1)
    logp = token_logprobs(
        params, tokens, result.sequence_mask_rs, result.sequence_positions_rs, targets,
        config=config, temperature=temperature,
    )
    logp_rn = logp[:, p - 1: p - 1 + result.response_tokens_rn.shape[1]]
    return jnp.where(result.response_mask_rn, logp_rn, 0.0)


def compile_count() -> int:
    """How many programs the sampler has compiled in this process (for tests and benchmarks)."""
    return _generate_jit._cache_size()
