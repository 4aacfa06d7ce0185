"""The TRL side of `kljax bench rl` (run in its own process): `GRPOTrainer` on the same prompts, reward
and settings as kljax's side, timed per optimizer step by a `TrainerCallback`.

GRPOConfig: num_generations = G, per_device_train_batch_size = B * G / M with
gradient_accumulation_steps = steps_per_generation = M (`--micro-batches`, default 1) and
num_iterations = 1 (so one generation batch of B * G completions per optimizer step, and TRL
takes the old log-probs from the policy's own forward, as on-policy kljax does), loss_type "grpo"
(sequence mean of token means, as kljax's seq-mean-token-mean), group-std reward scaling, k3 KL
in the loss (beta), PPO clip, constant learning rate, AdamW with global-norm clipping 1.0,
float32 weights (bf16=True, torch autocast, with `--dtype bfloat16`), unshuffled data, no logging
or saving. The reward function calls kljax's `score_batch` on the decoded completions. Timing
splits: the `_generate` call (sampling), the reward function, and the rest of the step
(reference log-probs, forward, backward and optimizer step).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.rl import BETA, CLIP, LEARNING_RATE, iteration_prompts, progress, side_result


def peft_config(settings: dict[str, Any]) -> Any:
    """peft's LoraConfig matching kljax's model.lora (same rank, alpha, target modules, no dropout or
    bias), or None for full fine-tuning. TRL then trains the adapters only and takes the reference
    log-probs from the same model with the adapters disabled, as kljax does."""
    if not settings.get("lora_rank"):
        return None
    from peft import LoraConfig

    from kljax.models.lora import HF_MODULES

    return LoraConfig(r=settings["lora_rank"], lora_alpha=settings["lora_alpha"], lora_dropout=0.0, bias="none",
                      target_modules=[HF_MODULES[t].split(".")[-1] for t in settings["lora_targets"]],
                      task_type="CAUSAL_LM")


def peer_side(settings: dict[str, Any]) -> dict[str, Any]:
    """Run `GRPOTrainer.train()` for settings["iterations"] steps; the timed steps' seconds, split,
    tokens and model FLOPs (`rl.side_result`), peak memory and versions."""
    import psutil
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from kljax.tasks.rewards import score_batch

    torch.set_num_threads(settings["threads"])
    t_setup = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    task, fmt, examples, texts = iteration_prompts(settings, tokenizer)
    flat = [ex for step in examples for ex in step]
    prompts = [t for step in texts for t in step]
    same_tokens = all(tokenizer(t)["input_ids"] == tokenizer.encode(t, add_special_tokens=False) for t in prompts)
    dataset = Dataset.from_list([{"prompt": t, "index": i} for i, t in enumerate(prompts)])
    b, g, n_iter = settings["prompts"], settings["group"], settings["iterations"]
    m = settings["micro_batches"]
    tokens: list[dict[str, float]] = []
    times: dict[str, list[float]] = {"sample": [], "reward": [], "total": [], "cpu": [], "rss_first": []}

    def arithmetic_reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                          index: list[int], **_: Any) -> list[float]:
        """kljax's arithmetic reward of each completion (the same scorer as kljax's rollout)."""
        t0 = time.perf_counter()
        rewards, _ = score_batch(task, [flat[i] for i in index], completions)
        times["reward"].append(time.perf_counter() - t0)
        prompt_tokens = sum(len(tokenizer(p)["input_ids"]) for p in prompts)
        gen = sum(len(c) for c in completion_ids)
        tokens.append({"prompt_unique": prompt_tokens / g, "generated": gen, "sequence": prompt_tokens + gen,
                       "completions": len(completions)})
        return [float(r) for r in rewards]

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times["total"].append(time.perf_counter() - self.t0)
            times["cpu"].append(time.process_time() - self.c0)
            progress("peer", len(times["total"]), n_iter, times["total"][-1],
                     {"sample": times["sample"][-1] if times["sample"] else 0.0})
            if len(times["total"]) == 1:
                times["rss_first"].append(common.peak_rss_mb())

    cuda = torch.cuda.is_available()
    config = GRPOConfig(
        output_dir=str(Path(settings["workdir"]) / "trl"), seed=settings["seed"], use_cpu=not cuda,
        bf16=settings["dtype"] == "bfloat16",
        fp16=False, gradient_checkpointing=settings["gradient_checkpointing"],
        model_init_kwargs={"dtype": torch.float32},
        per_device_train_batch_size=b * g // m, gradient_accumulation_steps=m, steps_per_generation=m,
        num_iterations=1, num_generations=g, max_completion_length=settings["new_tokens"],
        temperature=settings["temperature"], top_p=1.0, top_k=0, beta=BETA, loss_type="grpo",
        scale_rewards="group", epsilon=CLIP, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        max_steps=n_iter, shuffle_dataset=False, disable_dropout=True, logging_strategy="no",
        save_strategy="no", report_to="none", log_completions=False, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=settings["model_dir"], reward_funcs=arithmetic_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Timer()],
                          peft_config=peft_config(settings))
    generate = trainer._generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*a, **k)
        times["sample"].append(time.perf_counter() - t0)
        return out

    trainer._generate = timed_generate
    setup_s = time.perf_counter() - t_setup
    rss_setup = common.peak_rss_mb()
    trainer.train()
    if len(times["total"]) != n_iter or len(tokens) != n_iter:
        raise RuntimeError(f"TRL ran {len(times['total'])} steps and {len(tokens)} generations, expected {n_iter}")
    skip = 1 + settings["warmup"]
    splits = [{"sample": s, "reward": r, "score_and_update": t - s - r, "total": t, "cpu": c}
              for s, r, t, c in zip(*(times[k][skip:] for k in ("sample", "reward", "total", "cpu")), strict=True)]
    model = trainer.model
    params = common.body_and_head_params(sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n),
                                         *model.get_input_embeddings().weight.shape, model.config.tie_word_embeddings)
    return side_result(splits, tokens[skip:], params, settings, int(trainer.state.global_step), extra={
        "first_iteration_s": round(times["total"][0], 3), "setup_s": round(setup_s, 3),
        "rss_after_setup_mb": rss_setup, "rss_after_first_iteration_mb": times["rss_first"][0],
        "rss_resident_at_end_mb": psutil.Process().memory_info().rss / 2**20, "prompt_format": fmt,
        "prompt_tokens_match_kljax": same_tokens, "mixed_precision": str(trainer.accelerator.mixed_precision),
        "device": "cuda" if cuda else "cpu",
        "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "peak_device_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "versions": common.versions(),
    })
