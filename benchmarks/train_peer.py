"""The peer of `kljax bench train`: the same policy update written with transformers + PyTorch eager.

One update = forward of the HF causal LM over the B x S tokens (logits only at the R + 1 last
positions, `logits_to_keep`, as TRL does), log-probs of the response tokens in float32
(gather - logsumexp), the loss of `torch_losses.rl_loss` (clipped policy loss with the advantages
+ beta * token-level KL estimator in the loss, the train step's aggregation), backward,
`clip_grad_norm_` and `torch.optim.AdamW` with the kljax optimizer's hyper-parameters (constant
learning rate). bfloat16 runs use fp32 weights under `torch.autocast(bfloat16)`, the counterpart
of kljax's float32 params with a bfloat16 compute dtype.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import torch_losses


class TorchRLStep:
    """transformers model + AdamW on one fixed batch (numpy arrays as in `kljax.train.step.Batch`).

    batch: tokens_bs, mask_bs, positions_bs [B, S]; response_mask_br, sampler_logp_br, ref_logp_br,
    advantages_br [B, R]. `step()` does one update and returns its pre-update loss and grad norm.
    """

    def __init__(self, model_dir: str | Path, batch: dict[str, np.ndarray], *, beta: float, estimator: str,
                 aggregation: str, clip_low: float | None, clip_high: float | None, optim: Any, dtype: str,
                 device: str | None = None, threads: int | None = None) -> None:
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.device = device or torch_losses.default_device()
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device).train()
        self.bf16 = dtype == "bfloat16"
        self.loss_kwargs = dict(beta=beta, estimator=estimator, aggregation=aggregation, clip_low=clip_low,
                                clip_high=clip_high)
        if optim.schedule != "constant" or optim.warmup_steps:
            raise ValueError("the PyTorch peer implements a constant learning rate only")
        self.max_grad_norm = optim.max_grad_norm
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=optim.learning_rate, betas=(optim.b1, optim.b2), eps=optim.eps,
                                     weight_decay=optim.weight_decay)
        t = lambda name, dtype: torch.from_numpy(np.asarray(batch[name])).to(self.device, dtype)
        self.tokens = t("tokens_bs", torch.long)
        self.mask = t("mask_bs", torch.long)
        self.positions = t("positions_bs", torch.long)
        self.response_mask = t("response_mask_br", torch.float32)
        self.sampler_logp = t("sampler_logp_br", torch.float32)
        self.ref_logp = t("ref_logp_br", torch.float32)
        self.advantages = t("advantages_br", torch.float32)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16)

    def response_logprobs(self) -> torch.Tensor:
        """log p(response token r | prefix), [B, R] float32."""
        r = self.response_mask.shape[1]
        with self._autocast():
            out = self.model(input_ids=self.tokens, attention_mask=self.mask, position_ids=self.positions,
                             logits_to_keep=r + 1, use_cache=False)
        logits = out.logits[:, :-1].float()
        targets = self.tokens[:, -r:]
        return logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, -1)

    def loss(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, pg_loss, kl_loss) at the current weights."""
        return torch_losses.rl_loss(self.response_logprobs(), self.sampler_logp, self.ref_logp, self.advantages,
                                    self.response_mask, **self.loss_kwargs)

    def step(self) -> dict[str, float]:
        """One update; returns the loss before it and the gradient's global norm (before clipping)."""
        self.opt.zero_grad(set_to_none=True)
        loss, _, _ = self.loss()
        loss.backward()
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in self.params]))
        self.opt.step()
        torch_losses.sync(self.device)
        return {"loss": float(loss.detach()), "grad_norm": float(norm)}

    def peak_device_bytes(self) -> int | None:
        if torch.device(self.device).type != "cuda":
            return None
        return int(torch.cuda.max_memory_allocated())
