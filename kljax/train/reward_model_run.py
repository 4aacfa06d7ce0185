"""A run's reward from its config: reward functions and, with reward.model=DIR, a reward model in JAX.

    reward = reward_from_config(config, task, mesh, policy, functions)   # a RewardSet, or None (the task's own)

The reward model scores the conversation [user: prompt, assistant: completion] rendered with its
tokenizer's chat template (prompt + completion without one), right-padded to a fixed length
(reward.model_max_len; 0 = twice rl.max_prompt_len + rl.max_new_tokens, at most the model's context;
longer sequences keep their last tokens), the rows sharded over the mesh's data axes like the
reference model's batch, its parameters placed by the same logical-axis rules.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from kljax.config.run import RunConfig
from kljax.models.reward_model import load_reward_model, reward_scores
from kljax.parallel.sharding import data_sharding
from kljax.tasks.base import Task
from kljax.tasks.prompting import has_chat_template
from kljax.train.reward_set import RewardSet


class RewardModelFunction:
    """A loaded reward model as a batched reward function: fn(prompts, completions, **_) -> list[float]
    (conversational prompts and completions are rendered as the conversation they are)."""

    spec = "reward.model"

    def __init__(self, model_dir: str, mesh: Any, max_len: int, dtype: str = "float32"):
        from transformers import AutoTokenizer

        self.rm = load_reward_model(model_dir, mesh=mesh, dtype=dtype, param_dtype=dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.mesh = mesh
        self.max_len = min(int(max_len), self.rm.config.max_position_embeddings)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.rm.config.pad_token_id or 0))

    def encode(self, prompts: list[str], completions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded token ids and mask [N, max_len] of each (prompt, completion)."""
        chat = has_chat_template(self.tokenizer)
        ids = np.full((len(prompts), self.max_len), self.pad_id, np.int32)
        mask = np.zeros((len(prompts), self.max_len), bool)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            messages = (list(p) if isinstance(p, list) else [{"role": "user", "content": p}]) + (
                list(c) if isinstance(c, list) else [{"role": "assistant", "content": c}])
            if chat:
                text = self.tokenizer.apply_chat_template(messages, tokenize=False)
                toks = self.tokenizer.encode(text, add_special_tokens=False)
            else:
                toks = self.tokenizer.encode("".join(m["content"] for m in messages))
            toks = list(toks)[-self.max_len:]
            ids[i, : len(toks)] = toks
            mask[i, : len(toks)] = True
        return ids, mask

    def __call__(self, prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        n = len(prompts)
        ids, mask = self.encode(list(prompts), list(completions))
        shards = 1 if self.mesh is None else int(self.mesh.shape["data"] * self.mesh.shape["fsdp"])
        rows = -(-n // shards) * shards
        if rows != n:  # pad the batch to whole shards with copies of its last row
            ids = np.concatenate([ids, np.repeat(ids[-1:], rows - n, 0)])
            mask = np.concatenate([mask, np.repeat(mask[-1:], rows - n, 0)])
        if self.mesh is None:
            scores = reward_scores(self.rm.params, self.rm.score, ids, mask, config=self.rm.config)
        else:
            with jax.set_mesh(self.mesh):
                ids_d, mask_d = jax.device_put((ids, mask), data_sharding(self.mesh, 2))
                scores = reward_scores(self.rm.params, self.rm.score, ids_d, mask_d, config=self.rm.config)
        return [float(s) for s in np.asarray(jax.device_get(scores))[:n]]


def reward_from_config(config: RunConfig, task: Task, mesh: Any, policy: Any = None,
                       functions: RewardSet | None = None) -> RewardSet | None:
    """`functions` (the run's reward functions, already bound before the policy loaded: `RewardSet.build`)
    with config.reward.model's reward model added, or None when there is neither."""
    r = config.reward
    rewards = functions if functions is not None else RewardSet.from_config(config, task)
    if r.model:
        default_len = 2 * (config.rl.max_prompt_len + config.rl.max_new_tokens)
        model = RewardModelFunction(r.model, mesh, r.model_max_len or default_len, dtype=config.model.dtype)
        if rewards is None:
            rewards = RewardSet(task, [], [], r.on_error, r.timeout_s)
        rewards.add("reward_model", model, r.model_weight)
    if rewards is not None and policy is not None:
        rewards.tokenizer = policy.tokenizer
    return rewards
