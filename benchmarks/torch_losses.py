"""PyTorch eager versions of kljax's KL estimators and RL losses: the benchmarks' peers.

Each function is the formula of its kljax counterpart written the way a PyTorch user would
(float32, masks applied with `torch.where` so padding never reaches values or gradients):
  estimators k1 = d, k2 = d^2 / 2, k3 = expm1(-d) + d           (kljax.rl.estimators)
  policy_loss_t = -min(r_t A_t, clip(r_t, 1 - eps_lo, 1 + eps_hi) A_t), r_t = exp(logp_t - mu_t)
  weights_and_denominator -> (w_b, D)                            (kljax.rl.objective)
  rl_loss = sum_b w_b (sum_t policy_loss + beta sum_t k(d_t)) / D  (kljax.rl.objective, KL in loss)
  kl_surrogate_both_rtg: sum_t r_t * sum_{s>=t} sg(k3_s) + sum_t k3_t  (kljax.rl.kl, placement both,
      reward_to_go credit, beta = 1)
  full_kl: sum_v p(v) (log p(v) - log p_ref(v)) from both models' logits, naive or chunked with
      torch.utils.checkpoint (kljax.rl.estimators.full_kl_from_logits / models.transformer_policy.full_kl_from_hidden)
Shapes: [B, T] per-token tensors; full-vocabulary functions take hidden [B, T, D] and a tied
unembedding [V, D]. Import needs torch.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint

Tensor = torch.Tensor


def masked(x_bt: Tensor, mask_bt: Tensor) -> Tensor:
    """x in float32 where mask > 0, else 0 (no value or gradient from padding)."""
    x = x_bt.float()
    return torch.where(mask_bt > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def k1(d: Tensor) -> Tensor:
    return d


def k2(d: Tensor) -> Tensor:
    return 0.5 * d * d


def k3(d: Tensor) -> Tensor:
    return torch.expm1(-d) + d


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def policy_loss(logp_bt: Tensor, sampler_logp_bt: Tensor, advantages_bt: Tensor, mask_bt: Tensor,
                clip_low: float | None = 0.2, clip_high: float | None = None) -> Tensor:
    """Per-token clipped surrogate to minimize, [B, T] (0 on padding); kljax.rl.losses.policy_loss."""
    mask = mask_bt.float()
    ratio = torch.exp(masked(logp_bt, mask) - masked(sampler_logp_bt, mask).detach())
    adv = advantages_bt.float().detach()
    surrogate = ratio * adv
    if clip_low is not None:
        high = clip_low if clip_high is None else clip_high
        surrogate = torch.minimum(surrogate, torch.clamp(ratio, 1.0 - clip_low, 1.0 + high) * adv)
    return -surrogate * mask


def weights_and_denominator(mask_bt: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """(w_b [B], D) as kljax.rl.objective.sequence_weights / denominator, for the same four modes."""
    mask = mask_bt.float()
    b, r = mask.shape
    ones = torch.ones(b, device=mask.device)
    n_seq = torch.tensor(float(b), device=mask.device)
    if mode == "token-mean":
        return ones, mask.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        return 1.0 / mask.sum(1).clamp(min=1.0), n_seq
    if mode == "seq-mean-token-sum":
        return ones, n_seq
    if mode == "seq-mean-token-sum-norm":
        return ones, n_seq * r
    raise ValueError(f"unknown loss aggregation {mode!r}")


def rl_loss(logp_bt: Tensor, sampler_logp_bt: Tensor, ref_logp_bt: Tensor, advantages_bt: Tensor, mask_bt: Tensor,
            beta: float, estimator: str = "k3", aggregation: str = "seq-mean-token-sum-norm",
            clip_low: float | None = 0.2, clip_high: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, pg_loss, kl_loss): the train step's loss with a token-level estimator in the loss.

    loss = sum_b w_b (sum_t policy_loss_bt + beta * sum_t k(logp - ref_logp)) / D.
    """
    w, den = weights_and_denominator(mask_bt, aggregation)
    pg_sum = (w * policy_loss(logp_bt, sampler_logp_bt, advantages_bt, mask_bt, clip_low, clip_high).sum(1)).sum()
    d = masked(logp_bt, mask_bt) - masked(ref_logp_bt, mask_bt)
    kl_sum = (w * (ESTIMATORS[estimator](d) * mask_bt.float()).sum(1)).sum()
    pg_loss, kl_loss = pg_sum / den, kl_sum / den
    return pg_loss + beta * kl_loss, pg_loss, kl_loss


def kl_surrogate_both_rtg(logp_bt: Tensor, ref_logp_bt: Tensor, mask_bt: Tensor, sampler_logp_bt: Tensor) -> Tensor:
    """Per-sequence [B]: k3 in reward (reward-to-go credit, through the token ratio) plus k3 in loss."""
    mask = mask_bt.float()
    logp = masked(logp_bt, mask)
    k = k3(logp - masked(ref_logp_bt, mask)) * mask
    future = torch.flip(torch.cumsum(torch.flip(k.detach(), [1]), 1), [1]) * mask
    ratio = torch.exp(logp - masked(sampler_logp_bt, mask).detach())
    return (ratio * future).sum(1) + k.sum(1)


def full_kl_from_logits(logits_btv: Tensor, ref_logits_btv: Tensor) -> Tensor:
    """sum_v p (log p - log p_ref) over the last axis, [B, T, V] x 2 -> [B, T], float32."""
    logp = torch.log_softmax(logits_btv.float(), -1)
    ref_logp = torch.log_softmax(ref_logits_btv.float(), -1)
    return (logp.exp() * (logp - ref_logp)).sum(-1)


def full_kl_from_hidden(w_vd: Tensor, ref_w_vd: Tensor, h_btd: Tensor, ref_h_btd: Tensor,
                        chunk: int | None = None) -> Tensor:
    """Full-vocabulary KL from hidden states and tied unembeddings, [B, T].

    chunk None: naive, the [B, T, V] logits of both models at once. Else the sequence is cut into
    `chunk`-position slices, each under torch.utils.checkpoint (recomputed in the backward).
    """

    def one(h: Tensor, ref_h: Tensor) -> Tensor:
        return full_kl_from_logits(h @ w_vd.T, ref_h @ ref_w_vd.T)

    if chunk is None:
        return one(h_btd, ref_h_btd)
    parts = [
        torch.utils.checkpoint.checkpoint(one, h_btd[:, i:i + chunk], ref_h_btd[:, i:i + chunk], use_reentrant=False)
        for i in range(0, h_btd.shape[1], chunk)
    ]
    return torch.cat(parts, 1)


def sync(device: str | torch.device) -> None:
    """Wait for queued device work (CUDA kernels are asynchronous)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def default_device() -> str:
    """cuda when this PyTorch build sees a GPU, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"
