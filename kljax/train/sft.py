"""Supervised warm start: teach a tiny character-level transformer a task before RL (the reference model).

    summary = sft_warm_start(SFTSettings(task="arithmetic", steps=600), "OUT_DIR")

Per step s the batch is `task.examples(split, n=batch_size, seed=(seed, s))`; each example becomes prompt
(left-padded to P = max_prompt_len) + target (the reference answer, then EOS, right-padded to
R = max_answer_len + 1). The loss, the mean cross-entropy of the target tokens,
    L(theta) = - sum_{b,r} m_br log pi_theta(y_br | x_b, y_b<r) / sum_{b,r} m_br,
is computed with the trainer's own `response_logprobs` (the RL step's sequence layout) and minimized with
AdamW (linear warmup, cosine decay, global-norm clipping at 1). The result is a Hugging Face checkpoint
directory (`export_hf`) with a fast tokenizer that encodes exactly like `CharTokenizer`
(`save_char_tokenizer`), so `config.model.source = OUT_DIR` makes it both the RL policy's start and its
frozen reference; OUT_DIR/sft.json holds the loss curve and the greedy accuracy per split. A directory that
already has sft.json is reused as is (sweeps call this once per invocation).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig
from kljax.models.convert import export_hf
from kljax.models.tokenizers import DEFAULT_ALPHABET, CharTokenizer
from kljax.models.transformer import positions_from_mask
from kljax.policies.transformer import response_logprobs
from kljax.tasks.registry import get_task
from kljax.tasks.rewards import score_batch
from kljax.train.evaluate_loop import greedy_completions
from kljax.train.policy import Policy
from kljax.train.rollout import encode_prompts, prompt_texts
from kljax.train.run_build import enable_compilation_cache

# Every character of the arithmetic task's raw prompts ("What is 12 + 34?") and answers.
ARITHMETIC_ALPHABET = DEFAULT_ALPHABET + "/Whatis"
SFT_SUMMARY = "sft.json"


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """What to teach, to which model, for how long. Prompts are the task's raw prompts."""

    task: str = "arithmetic"
    split: str = "train"
    eval_splits: str = "test,ood_digits,ood_ops"
    alphabet: str = ARITHMETIC_ALPHABET
    hidden_size: int = 64
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 64
    init_std: float = 0.02
    steps: int = 600
    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    max_prompt_len: int = 24
    max_answer_len: int = 5
    eval_examples: int = 128
    seed: int = 0

    @classmethod
    def from_mapping(cls, values: Any) -> SFTSettings:
        values = dict(values)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown sft field(s) {unknown}; valid: {sorted(names)}")
        return cls(**values)


def model_config(s: SFTSettings) -> ModelConfig:
    """The Llama-style ModelConfig of the warm-started model (vocabulary: the char tokenizer's)."""
    vocab = CharTokenizer(s.alphabet).vocab_size
    return ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=vocab, hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size, num_layers=s.num_layers, num_heads=s.num_heads,
        num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, max_position_embeddings=s.max_position_embeddings,
        tie_embeddings=False, eos_token_ids=(CharTokenizer.eos_token_id,), pad_token_id=CharTokenizer.pad_token_id,
    )


def save_char_tokenizer(out_dir: str | Path, alphabet: str = DEFAULT_ALPHABET) -> Path:
    """Write a Hugging Face fast tokenizer with CharTokenizer's ids (0 '<pad>', 1 '<eos>', chars from 2):
    every character is its own token (a regex pre-tokenizer isolates each one), decoding concatenates.
    `AutoTokenizer.from_pretrained(out_dir)` then loads it, so `kljax.train.policy.load_policy` can."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    char = CharTokenizer(alphabet)
    vocab = {"<pad>": char.pad_token_id, "<eos>": char.eos_token_id}
    vocab.update({ch: char.encode(ch)[0] for ch in alphabet})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(str(out_dir))
    return Path(out_dir)


def export_char_model(params: Any, config: ModelConfig, out_dir: str | Path, alphabet: str,
                      overwrite: bool = True) -> Path:
    """A kljax model over a character vocabulary -> HF checkpoint dir with its tokenizer files."""

    out_dir = export_hf(params, config, out_dir, overwrite=overwrite)
    save_char_tokenizer(out_dir, alphabet)
    return out_dir


def make_batch(examples: list[Any], task: Any, tokenizer: CharTokenizer, prompt_len: int,
               answer_len: int) -> dict[str, np.ndarray]:
    """tokens/mask/positions [B, P + R] and the target mask [B, R] (answer chars + EOS), R = answer_len + 1."""

    texts = prompt_texts(examples, task, tokenizer, "raw")
    prompt_ids, prompt_mask = encode_prompts(texts, tokenizer, prompt_len, tokenizer.pad_token_id)
    r = answer_len + 1
    target = np.full((len(examples), r), tokenizer.pad_token_id, np.int32)
    target_mask = np.zeros((len(examples), r), bool)
    for i, ex in enumerate(examples):
        ids = tokenizer.encode(ex.answer) + [tokenizer.eos_token_id]
        if len(ids) > r:
            raise ValueError(f"answer {ex.answer!r} is longer than max_answer_len={answer_len}")
        target[i, : len(ids)] = ids
        target_mask[i, : len(ids)] = True
    mask = np.concatenate([prompt_mask, target_mask], axis=1)
    return {
        "tokens": np.concatenate([prompt_ids, target], axis=1), "mask": mask,
        "positions": np.asarray(positions_from_mask(jnp.asarray(mask))), "target_mask": target_mask.astype(np.float32),
    }


def _loss(params: Any, batch: dict[str, jax.Array], config: ModelConfig) -> jax.Array:

    r = batch["target_mask"].shape[1]
    logp = response_logprobs(params, batch["tokens"], batch["mask"], batch["positions"], r, config)
    m = batch["target_mask"]
    return -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)


def greedy_accuracy(params: Any, config: ModelConfig, s: SFTSettings, task: Any) -> dict[str, float]:
    """Greedy accuracy per eval split (raw prompts, `s.eval_examples` each, seed `s.seed`)."""

    tok = CharTokenizer(s.alphabet)
    policy = Policy(config, params, None, tok, (tok.eos_token_id,), tok.pad_token_id)
    out = {}
    for split in [x.strip() for x in s.eval_splits.split(",") if x.strip()]:
        examples = task.examples(split, n=s.eval_examples, seed=s.seed)
        texts = prompt_texts(examples, task, tok, "raw")
        completions = greedy_completions(policy, params, texts, s.max_prompt_len, s.max_answer_len + 1, 64)
        _, correct = score_batch(task, examples, completions)
        out[split] = float(np.mean(correct))
    return out


def train_sft(settings: SFTSettings, progress: bool = True) -> tuple[Any, ModelConfig, list[float], float]:
    """(params, model config, loss per step, seconds): minimize the cross-entropy of the module docstring."""

    enable_compilation_cache()
    s = settings
    task = get_task(s.task)
    task.validate_split(s.split)
    tok = CharTokenizer(s.alphabet)
    config = model_config(s)
    params = jax.jit(lambda key: tfm.init_params(config, key, std=s.init_std))(jax.random.PRNGKey(s.seed))
    warmup = max(s.warmup_steps, 1)
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, s.learning_rate, warmup),
         optax.cosine_decay_schedule(s.learning_rate, max(s.steps - warmup, 1), alpha=0.05)], [warmup])
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(_loss)(params, batch, config)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    t0 = time.perf_counter()
    losses: list[float] = []
    bar = tqdm(range(s.steps), disable=not progress, desc="kljax sft", dynamic_ncols=True)
    for i in bar:
        examples = task.examples(s.split, n=s.batch_size, seed=(s.seed * 1_000_003 + i) % (2**31 - 1))
        batch = make_batch(examples, task, tok, s.max_prompt_len, s.max_answer_len)
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"SFT loss became {losses[-1]} at step {i}; lower sft.learning_rate")
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return params, config, losses, time.perf_counter() - t0


def sft_warm_start(settings: SFTSettings, out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Train (`train_sft`), export OUT_DIR (HF checkpoint + char tokenizer) and OUT_DIR/sft.json;
    returns that summary. Reuses OUT_DIR when sft.json is already there."""

    out_dir = Path(out_dir)
    if (out_dir / SFT_SUMMARY).exists():
        summary = json.loads((out_dir / SFT_SUMMARY).read_text())
        wanted = json.loads(json.dumps(dataclasses.asdict(settings)))
        if summary["settings"] != wanted:
            diff = sorted(k for k in wanted if summary["settings"].get(k) != wanted[k])
            raise ValueError(f"{out_dir} holds a model trained with other SFT settings (differing: {diff}); "
                             "delete it or use another directory")
        return summary
    params, config, losses, seconds = train_sft(settings, progress)
    accuracy = greedy_accuracy(params, config, settings, get_task(settings.task))
    export_char_model(params, config, out_dir, settings.alphabet)
    summary = {"settings": dataclasses.asdict(settings), "loss": losses, "greedy_accuracy": accuracy,
               "train_seconds": seconds, "model_dir": str(out_dir)}
    (out_dir / SFT_SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary
