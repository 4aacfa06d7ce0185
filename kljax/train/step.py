"""The jitted pieces of an RL iteration: scoring a batch, and the train step.

Sequences are prompt + response, `tokens_bs` [B, S] with the response in the last R positions
(S = P + R; the prompt is left-padded, the response right-padded). The policy is any policy model
(`kljax.policies.protocol`: the transformer, or the tabular policy of exact tests and studies).

The loss minimized by `train_step` is the objective of `kljax.rl.objective`:
    loss = sum_b w_b * (sum_t pg_bt + beta * kl_b) / D,
the clipped surrogate of the advantages (reward-placed KL folded in at rollout) plus the
loss-placed KL term, with one per-sequence weight w_b and one denominator D of the *whole* batch
for both, so accumulating micro-batch gradients gives exactly the full-batch gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from kljax.config.sections import OptimConfig
from kljax.kernels.cpu.adamw import (
    LAYERS,
    join_layers,
    split_layers,
    tree_all_finite,
    update_in_place,
    update_is_finite,
)
from kljax.models import lora
from kljax.parallel import sharding as shd
from kljax.parallel.sharding import constrain_batch
from kljax.policies.protocol import PolicyModel, as_policy
from kljax.rl import objective as obj
from kljax.rl.kl import KL_METRICS, KLConfig, kl_metric_sums, kl_metrics_from_sums
from kljax.train.state import TrainState, learning_rate_schedule
from kljax.train.trl_metrics import STEP_SUMS_INIT, step_means, step_sums

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Batch:
    """One RL batch, all arrays (B sequences of S = P + R tokens, R response positions).

    tokens_bs int32 [B, S]; mask_bs bool [B, S] (False on padding); positions_bs int32 [B, S];
    response_mask_br float32 [B, R] (1 on generated tokens up to and including the stop token);
    sampler_logp_br [B, R] log mu of the sampled tokens; ref_logp_br [B, R] log pi_ref;
    advantages_br [B, R]; beta: float32 scalar (traced, so an adaptive beta never recompiles).
    """

    tokens_bs: Array
    mask_bs: Array
    positions_bs: Array
    response_mask_br: Array
    sampler_logp_br: Array
    ref_logp_br: Array
    advantages_br: Array
    beta: Array



@dataclasses.dataclass(frozen=True)
class StepSettings:
    """Static settings of the train step (hashable). `model`: a `ModelConfig` or any policy model."""

    model: Any
    kl: KLConfig
    loss_aggregation: str = obj.DEFAULT_AGGREGATION
    clip_low: float | None = 0.2
    clip_high: float | None = None
    micro_batches: int = 1
    logprob_chunk: int = 256
    # The policy trained is softmax(logits / temperature), the reference's log-probs likewise: the
    # distribution a sampler at rl.temperature draws from (`kljax.config.RLConfig.policy_temperature`).
    temperature: float = 1.0
    # Dual-clip PPO (verl's clip_ratio_c): a token with a negative advantage and ratio above it has
    # no gradient. None: off.
    clip_ratio_c: float | None = None
    # Also return the batch's KL metrics and entropy (`kl_metrics` of the update's own forward at
    # the pre-update parameters): for a rollout that skipped the policy's scoring forward
    # (`kljax.train.rollout.policy_scored_in_update`).
    kl_metrics: bool = False

    def __post_init__(self) -> None:
        obj.check_aggregation(self.loss_aggregation)
        if self.micro_batches < 1:
            raise ValueError(f"rl.micro_batches={self.micro_batches} must be >= 1")

    @classmethod
    def from_rl(cls, model: Any, kl: KLConfig, rl: Any, kl_metrics: bool = False) -> StepSettings:
        """The train step of a run with `kljax.config.RLConfig` rl (the trainer's, and the exact tests')."""
        return cls(model, kl, rl.loss_aggregation, rl.clip_low, rl.clip_high, rl.micro_batches,
                   temperature=rl.policy_temperature, clip_ratio_c=rl.clip_ratio_c, kl_metrics=kl_metrics)

    @property
    def policy(self) -> PolicyModel:
        return as_policy(self.model)

    @property
    def objective(self) -> obj.Objective:
        return obj.Objective(self.kl, self.loss_aggregation, self.clip_low, self.clip_high, self.clip_ratio_c)


def trains_adapters(model: Any) -> bool:
    """Whether the train state's params are LoRA adapters over a frozen base (a `ModelConfig` with
    model.lora), so that the step combines them with the base it gets as ref_params."""
    return getattr(model, "lora", None) is not None


def score(
    params: Any, ref_params: Any, batch: Batch, model: Any, chunk: int = 256, micro_batches: int = 1,
    full_kl: bool = False, policy: bool = True, temperature: float = 1.0,
) -> dict[str, Array]:
    """Log-probs of the responses under the current policy (with entropy) and the reference. [B, R] each,
    both at `temperature` (logits / temperature: the tempered policy the train step optimizes).
    With full_kl, also the full-vocabulary KL at each response position ("full_kl", [B, R]).
    With policy=False only the reference's ("ref_logp"): for a caller that has the policy's from the
    sampler (`kljax.train.rollout.sampler_is_policy`); `params` is then unused.
    `model`: a `ModelConfig` or any policy model.

    With micro_batches > 1 the batch is scored in strided slices one after another (`lax.map`), so
    activations are held for B / micro_batches sequences at a time.
    """
    pm = as_policy(model)

    def one(mb: Batch) -> dict[str, Array]:
        mb = _constrain(mb)
        args = (mb.tokens_bs, mb.mask_bs, mb.positions_bs, mb.response_mask_br.shape[1])
        if full_kl:
            return pm.teacher_forced(params, *args, ref_params=ref_params, entropy=True, full_kl=True,
                                     ref_logp=True, chunk=chunk, temperature=temperature)
        out = {"ref_logp": pm.teacher_forced(ref_params, *args, chunk=chunk, temperature=temperature)["logp"]}
        if policy:
            out.update(pm.teacher_forced(params, *args, entropy=True, chunk=chunk, temperature=temperature))
        return out

    if full_kl and not policy:
        raise ValueError("score: full_kl needs the policy's forward pass (policy=True)")
    if micro_batches == 1:
        return one(batch)
    if batch.tokens_bs.shape[0] % micro_batches:
        raise ValueError(f"batch of {batch.tokens_bs.shape[0]} sequences does not split into {micro_batches}")
    out = jax.lax.map(one, _split(batch, micro_batches))
    return {k: _unsplit(v) for k, v in out.items()}


def batch_shardings(batch: Batch, mesh: Any) -> Batch:
    """Per-field shardings: sequences split over the (data, fsdp) axes, the scalar beta replicated."""

    return jax.tree.map(lambda x: shd.data_sharding(mesh, x.ndim) if x.ndim else shd.replicated(mesh), batch)


def _constrain(batch: Batch) -> Batch:
    return jax.tree.map(constrain_batch, batch)



def _loss_fn(params: Any, mb: Batch, denominator: Array, s: StepSettings, ref_params: Any = None,
             layers_grad_acc: Any = None):
    """The objective's weighted sums of one micro-batch over the whole batch's denominator.
    With LoRA (`trains_adapters`) `params` are the adapters and `ref_params` the frozen base: the
    policy is their combination, the reference the base alone."""
    mb = _constrain(mb)
    if trains_adapters(s.model):
        params = lora.combine(jax.lax.stop_gradient(ref_params), params)
    r = mb.response_mask_br.shape[1]
    full = s.kl.estimator == "full" and s.kl.placement != "none"
    if full and ref_params is None:
        raise ValueError("kl.estimator='full' needs ref_params in train_step")
    out = s.policy.teacher_forced(
        params, mb.tokens_bs, mb.mask_bs, mb.positions_bs, r, entropy=s.kl_metrics, full_kl=full,
        ref_params=jax.lax.stop_gradient(ref_params) if full else None, chunk=s.logprob_chunk,
        layers_grad_acc=layers_grad_acc, temperature=s.temperature,
    )
    logp, mask = out["logp"], mb.response_mask_br
    parts = obj.loss_parts(s.objective, logp, mb.sampler_logp_br, mb.ref_logp_br, mb.advantages_br, mask, mb.beta,
                           out.get("full_kl"))
    log_ratio = jnp.where(mask > 0, logp - mb.sampler_logp_br, 0.0)
    aux = {
        "pg_loss_sum": parts.pg_sum,
        "kl_loss_sum": parts.kl_sum,
        "clipped_sum": jnp.sum(parts.clipped_bt),
        "ratio_sum": jnp.sum(jnp.exp(log_ratio) * mask),
        "ratio_max": jnp.max(jnp.where(mask > 0, log_ratio, -jnp.inf)),
        "ratio_min": jnp.min(jnp.where(mask > 0, log_ratio, jnp.inf)),
        **step_sums(jax.lax.stop_gradient(logp), mb.sampler_logp_br, mb.ref_logp_br, mb.advantages_br, mask,
                    s.clip_low, s.clip_high),  # TRL's kl and clip_ratio/* (`kljax.train.trl_metrics`)
    }
    if s.kl_metrics:  # sums over this micro-batch; `train_step` divides by the whole batch's counts
        sums = _batch_metric_sums(jax.lax.stop_gradient(logp), mb.ref_logp_br,
                                  jax.lax.stop_gradient(out["entropy"]), mask)
        aux.update({f"{k}_sum": v for k, v in sums.items()})
    return parts.loss_sum / denominator, aux


BATCH_METRICS = (*KL_METRICS, "entropy")


def _batch_metric_sums(logp_br: Array, ref_logp_br: Array, entropy_br: Array, mask_br: Array) -> dict[str, Array]:
    """The sums (over tokens, over sequences for kl_seq) behind `batch_kl_metrics`, BATCH_METRICS keys."""
    return {**kl_metric_sums(logp_br, ref_logp_br, mask_br), "entropy": jnp.sum(entropy_br * mask_br)}


def _batch_metrics_from_sums(sums: dict[str, Array], mask_br: Array) -> dict[str, Array]:
    """`_batch_metric_sums` of the whole batch -> the logged means, and the mean response length."""
    out = kl_metrics_from_sums(sums, mask_br)
    out["entropy"] = sums["entropy"] / jnp.maximum(jnp.sum(mask_br), 1.0)
    out["response_length"] = jnp.mean(jnp.sum(mask_br, axis=1))
    return out


def _split(batch: Batch, n: int) -> Batch:
    """[B, ...] -> [n, B/n, ...], strided: micro-batch i holds rows i, i + n, i + 2n, ...

    Rows are sharded over devices in contiguous blocks, so a strided split gives every micro-batch
    an equal share of every device's rows (a contiguous split would put a micro-batch on one device).
    The scalar beta is broadcast.
    """

    def split(x: Array) -> Array:
        if x.ndim == 0:
            return jnp.broadcast_to(x, (n,))
        return x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


def _unsplit(x_nb: Array) -> Array:
    """Inverse of `_split` for one field: [n, B/n, ...] -> [B, ...]."""
    return x_nb.swapaxes(0, 1).reshape(-1, *x_nb.shape[2:])



def train_step(
    state: TrainState, batch: Batch, ref_params: Any = None, *, settings: StepSettings,
    tx: optax.GradientTransformation | OptimConfig,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer update on `batch`, gradients accumulated over `settings.micro_batches`.

    tx: an optax transformation, applied to the whole tree; or an OptimConfig, whose
    `make_optimizer` update (the state must be that optimizer's) is applied layer by layer in place
    (`kernels.cpu.adamw.update_in_place`: the same numbers, without three parameter-sized temporaries).

    `ref_params` (the frozen reference) is needed only by kl.estimator='full' in the loss, whose
    per-position KL takes both models' logits inside the differentiated function.

    A step whose loss, gradient, updated params or optimizer state is not finite leaves params and
    optimizer state unchanged and reports `nonfinite = 1`. Pure: jit it once with shardings and `donate_argnums=0`.
    """
    b = batch.tokens_bs.shape[0]
    m = settings.micro_batches
    if b % m:
        raise ValueError(f"batch of {b} sequences does not split into rl.micro_batches={m}")
    mask = batch.response_mask_br
    den = obj.denominator(mask, settings.loss_aggregation)
    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)

    # With remat='full' and micro-batches, the layers' backward adds into the accumulator in place
    # (`layer_stack.accumulate_layers`, which recomputes each layer as remat='full' does): one
    # gradient tree for the stacked layers instead of the accumulator plus each micro-batch's.
    remat = getattr(settings.policy, "remat", "none")
    # (Not with LoRA: the forward's layers are the base's and the adapters', the gradient only the adapters'.)
    adapters = trains_adapters(settings.model)
    accumulate_in_backward = m > 1 and remat == "full" and LAYERS in state.params and not adapters
    if adapters and ref_params is None:
        raise ValueError("train_step with model.lora: pass the frozen base as ref_params (state.params: adapters)")

    def accumulate(carry, mb):
        grads, loss, aux = carry
        if accumulate_in_backward:
            rest, acc_layers = split_layers(grads)
            (l_mb, aux_mb), g_mb = grad_fn(state.params, mb, den, settings, ref_params, acc_layers)
            rest_mb, layers_mb = split_layers(g_mb)  # layers_mb already holds acc_layers + its gradient
            grads = join_layers(jax.tree.map(jnp.add, rest, rest_mb), layers_mb)
        else:
            (l_mb, aux_mb), g_mb = grad_fn(state.params, mb, den, settings, ref_params)
            grads = jax.tree.map(jnp.add, grads, g_mb)
        aux = {  # metrics in float32 whatever the policy's dtype (a float64 study's too)
            k: (jnp.maximum if k.endswith("_max") else jnp.minimum if k.endswith("_min") else jnp.add)(
                aux[k], v.astype(jnp.float32))
            for k, v in aux_mb.items()
        }
        return (grads, loss + l_mb.astype(jnp.float32), aux), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    aux0 = {"pg_loss_sum": 0.0, "kl_loss_sum": 0.0, "clipped_sum": 0.0, "ratio_sum": 0.0,
            "ratio_max": -jnp.inf, "ratio_min": jnp.inf, **STEP_SUMS_INIT}
    if settings.kl_metrics:
        aux0.update({f"{k}_sum": 0.0 for k in BATCH_METRICS})
    aux0 = {k: jnp.asarray(v, jnp.float32) for k, v in aux0.items()}
    if m == 1:
        (grads, loss, aux), _ = accumulate((zeros, jnp.zeros((), jnp.float32), aux0), batch)
    else:
        (grads, loss, aux), _ = jax.lax.scan(accumulate, (zeros, jnp.zeros((), jnp.float32), aux0), _split(batch, m))

    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)  # and the updated params and moments:
    if isinstance(tx, OptimConfig):
        schedule = learning_rate_schedule(tx)
        finite = finite & update_is_finite(tx, schedule, grads, state.opt_state, state.params, grad_norm)
        new_params, new_opt = update_in_place(tx, schedule, grads, state.opt_state, state.params, grad_norm, finite)
    else:
        updates, new_opt = tx.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        finite = finite & tree_all_finite(new_params) & tree_all_finite(new_opt)
        keep = lambda new, old: jax.tree.map(lambda a, o: jnp.where(finite, a, o), new, old)
        new_params = keep(new_params, state.params)
        new_opt = keep(new_opt, state.opt_state)
    new_state = TrainState(params=new_params, opt_state=new_opt, step=state.step + 1, rng=state.rng)
    n_tokens = jnp.maximum(jnp.sum(mask), 1.0)
    metrics = {
        "loss": loss,
        "pg_loss": aux["pg_loss_sum"] / den,
        "kl_loss": aux["kl_loss_sum"] / den,
        "grad_norm": grad_norm,
        "clip_fraction": aux["clipped_sum"] / n_tokens,
        "ratio_mean": aux["ratio_sum"] / n_tokens,
        "ratio_max": jnp.exp(aux["ratio_max"]),
        "ratio_min": jnp.exp(aux["ratio_min"]),
        "nonfinite": 1.0 - finite.astype(jnp.float32),
        "beta": batch.beta,
        **step_means(aux, mask),
    }
    if settings.kl_metrics:  # as `batch_kl_metrics` of a policy scoring pass
        metrics.update(_batch_metrics_from_sums({k: aux[f"{k}_sum"] for k in BATCH_METRICS}, mask))
    return new_state, metrics


@jax.jit
def batch_kl_metrics(scored: dict[str, Array], mask_br: Array) -> dict[str, Array]:
    """k1/k2/k3 means, sequence KL, entropy and response length of a scored batch. One compiled
    program, not a dozen eager sharded ops (see `kljax.util.threads` for what many of those can do)."""
    sums = _batch_metric_sums(scored["logp"], scored["ref_logp"], scored["entropy"], mask_br)
    return _batch_metrics_from_sums(sums, mask_br)
