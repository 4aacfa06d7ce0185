"""`kljax bench rl`: one whole RL iteration, kljax's trainer vs TRL's `GRPOTrainer`, matched settings.

    kljax bench rl [--model DIR|random:NAME] [--prompts 8] [--group 4] [--new-tokens 64]
                   [--repeats 5] [--warmup 1] [--threads N] [--micro-batches M] [--gradient-checkpointing]
                   [--dtype float32|bfloat16] [--no-scan] [--peak-gflops G] [--no-peer] [--json PATH]

An iteration: sample G completions for each of B arithmetic prompts (up to N new tokens, temperature
1) -> rewards (kljax's arithmetic scorer, on both sides) -> reference log-probs (on-policy neither
side runs a second policy forward pass: TRL takes log pi from its update's own forward; kljax in
float32 from the sampler, `rl.reuse_sampler_logprobs`, and in bfloat16, where the sampler's and
teacher-forced log-probs differ by rounding, its update reports the KL metrics from its own
forward, `kljax.train.rollout.policy_scored_in_update`) -> group advantages -> one AdamW update on the
B * G completions. kljax runs its real trainer (`run_build.build` for the model, task, optimizer and jitted score/step
functions, then `trainer.iteration`, the loop body of `kljax train`, metrics row included) with GRPO
advantages and k3 in the loss (beta 0.04), the KL of TRL's GRPO; TRL runs `GRPOTrainer.train()` with
num_generations=G and one generation batch per optimizer step (per_device_train_batch_size = B * G,
gradient_accumulation_steps = steps_per_generation = num_iterations = 1), loss_type="grpo", the same
learning rate, PPO clip, gradient clipping and AdamW settings, the same compute dtype (`--dtype`: float32, or
bfloat16 compute over float32 weights and optimizer state on both sides: kljax model.dtype, TRL bf16=True,
i.e. torch autocast, for sampling, scoring and the update alike), no vLLM, and activation
recomputation on both sides or neither (`--gradient-checkpointing`; kljax's default config has none,
TRL's GRPOConfig turns it on by default; with micro-batches kljax's remat='full' also adds each
micro-batch's layer gradients into the accumulator in place), and the update's B * G completions split into the same
number of micro-batches on both sides (`--micro-batches M`, exact gradient accumulation: kljax
`rl.micro_batches` = M, which also splits its reference scoring; TRL per_device_train_batch_size
= B * G / M with gradient_accumulation_steps = steps_per_generation = M, still one generation and
one optimizer step per iteration). Both see the same prompts in the same order (TRL's dataset
unshuffled), rendered to the same text by kljax's prompt code. Not matched: TRL's KL term is a per-
sequence token mean, kljax's a per-sequence token sum (same work, different scale).

Each side runs in its own subprocess pinned to the same `--threads` CPUs (torch gets as many
threads), so peak memory (`ru_maxrss`) is per side and the two thread pools never compete. Each
does 1 + warmup + repeats iterations; the first (kljax: compilation, persistent cache off; TRL:
lazy set-up) and the warm-up ones are untimed. Seconds per iteration: the median of the timed
ones, with min/max/quartiles; kljax's XLA compile time is reported apart. TRL's iterations are
timed by a `TrainerCallback` (on_step_begin .. on_step_end encloses generation, rewards, reference
log-probs and the optimizer step). The sides live in `benchmarks.rl_kljax` and
`benchmarks.rl_peer`; this module holds the settings, the child processes, what both sides share
and the report.

Model FLOPs of one iteration, with N the non-embedding parameters and H = V * D the output head
(whose logits are needed only where a completion token is predicted); norms, attention scores,
recomputed activations and the optimizer's elementwise work are left out:
    sampling  2 N (P_u + T_gen) + 2 H T_gen      P_u real prompt tokens of the B distinct prompts
                                                 (prefilled once for their G samples), T_gen real
                                                 generated tokens
    scoring   2 N T_seq + 2 H T_gen              the reference's forward over the T_seq real tokens
                                                 of the B * G prompt + completion sequences (on-policy
                                                 the policy's log-probs need no forward of their own)
    update    6 N T_seq + 6 H T_gen              forward + backward; with LoRA (--lora) 4 N T_seq + 4 H T_gen:
                                                 the frozen base's weight gradients are never computed
                                                 (the adapters' rank-r matmuls are left out)
    MFU = model FLOPs / (seconds per iteration * peak), the peak a matmul in the run's dtype measured in the
    kljax process (`common.peak_gflops`) on the same CPUs, or `--peak-gflops`.
JSON (`--json`): `kljax`, `peer` (seconds per iteration, medians), `ratio` = peer seconds / kljax
seconds (= kljax speed / TRL speed), `mfu` (kljax's), `sides` (times, spread, split, peak memory,
tokens, compile time), `settings`, `machine`, `versions`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from kljax.util.threads import without_forced_devices

BETA = 0.04  # KL coefficient, k3 in the loss on both sides
LEARNING_RATE = 1e-6
CLIP = 0.2
TASK, SPLIT = "arithmetic", "train"
CHAR_VOCAB = 96  # the character tokenizer of a random model whose vocabulary is smaller than SmolLM2's


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint directory with a tokenizer, or random:NAME[:field=value,...] "
                        "(with SmolLM2's tokenizer, or a character tokenizer when vocab_size is smaller) "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration (B)")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (G)")
    parser.add_argument("--new-tokens", type=int, default=64, help="max new tokens per sample")
    parser.add_argument("--repeats", type=int, default=5, help="timed iterations per side (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations per side after the first")
    parser.add_argument("--threads", type=int, default=None, help="CPUs each side is pinned to (default: all)")
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="peak GFLOP/s for MFU (default: measure a matmul in --dtype now)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="compute dtype on both sides; weights and AdamW state stay float32 (TRL: bf16=True, "
                        "torch autocast)")
    parser.add_argument("--no-scan", action="store_true",
                        help="kljax: unroll the layers (model.scan_layers=False), faster in bfloat16 on CPU; the "
                        "in-place micro-batch accumulation of --gradient-checkpointing scans the update regardless")
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="split the update (and kljax's reference scoring) into M micro-batches on both sides, "
                        "accumulating gradients; M must divide prompts * group (default 1: the whole batch at once)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in the backward pass on both sides (kljax model.remat='full', "
                        "TRL gradient_checkpointing=True, TRL's GRPOConfig default; with --micro-batches kljax then "
                        "accumulates layer gradients in place); off: neither does")
    parser.add_argument("--lora", type=int, default=0, metavar="RANK",
                        help="LoRA adapters of this rank on both sides (kljax model.lora, TRL a peft LoraConfig with "
                        "the same rank, alpha and target modules); the base frozen, the reference the base with the "
                        "adapters off on both sides. 0 (default): full fine-tuning")
    parser.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA alpha (scale alpha / rank), both sides")
    parser.add_argument("--lora-targets", default="q,k,v,o,gate,up,down",
                        help="LoRA targets, comma-separated (kljax names; TRL gets q_proj, ..., down_proj)")
    parser.add_argument("--force-peer", action="store_true",
                        help="run TRL's side in bfloat16 even where torch's bfloat16 matmul is far slower than its "
                        "float32 one (a CPU without native bfloat16), which can take hours")
    common.add_run_flags(parser)


def _available_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _validate(args: argparse.Namespace) -> dict[str, Any]:
    """The settings both children read, after checking every flag."""
    common.check_counts(args, ("prompts", "new_tokens", "repeats", "micro_batches"))
    if args.group < 2:
        raise ValueError(f"--group must be >= 2 (a group baseline needs other samples), got {args.group}")
    if (args.prompts * args.group) % args.micro_batches:
        raise ValueError(f"--micro-batches {args.micro_batches} must divide the batch of --prompts * --group = "
                         f"{args.prompts * args.group} completions")
    cpus = _available_cpus()
    threads = len(cpus) if args.threads is None else args.threads
    if not 1 <= threads <= len(cpus):
        raise ValueError(f"--threads must be between 1 and the {len(cpus)} available CPUs, got {args.threads}")
    common.check_peak_gflops(args.peak_gflops)
    if args.lora < 0:
        raise ValueError(f"--lora must be >= 0 (0: full fine-tuning), got {args.lora}")
    if args.lora:
        from kljax.config.sections import LoraConfig

        LoraConfig(args.lora, args.lora_alpha, tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()))
    model = args.model
    if model and not model.startswith(common.RANDOM_PREFIX) and not (Path(model) / "config.json").is_file():
        raise ValueError(f"--model {model!r} is neither an HF checkpoint directory (no config.json) nor "
                         f"{common.RANDOM_PREFIX}NAME")
    return {
        "model": model, "prompts": args.prompts, "group": args.group, "new_tokens": args.new_tokens,
        "repeats": args.repeats, "warmup": args.warmup, "iterations": 1 + args.warmup + args.repeats,
        "threads": threads, "cpus": cpus[:threads], "seed": args.seed, "peak_gflops": args.peak_gflops,
        "temperature": 1.0, "beta": BETA, "kl": "k3 in the loss, per token", "advantage": "grpo (group mean/std)",
        "learning_rate": LEARNING_RATE, "clip": CLIP, "max_grad_norm": 1.0, "task": f"{TASK}:{SPLIT}",
        "dtype": args.dtype, "scan_layers": not args.no_scan,
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "micro_batches": args.micro_batches,
        "lora_rank": args.lora, "lora_alpha": args.lora_alpha,
        "lora_targets": [t.strip() for t in args.lora_targets.split(",") if t.strip()] if args.lora else [],
    }


def run(args: argparse.Namespace) -> int:
    settings = _validate(args)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kljax-bench-rl-") as tmp:
        settings["model_dir"] = str(_materialize_model(settings, Path(tmp)))
        sides = {"kljax": _run_child("kljax", settings, Path(tmp))}
        skipped = None if args.no_peer or args.force_peer else slow_peer_reason(settings)
        if skipped:
            print(f"kljax bench rl: the TRL side is skipped: {skipped}", file=sys.stderr, flush=True)
        elif not args.no_peer:
            sides["peer"] = _run_child("peer", settings, Path(tmp))
    summary = summarize(sides, settings)
    if skipped:
        summary["peer_skipped"] = skipped
    summary["machine"] = {
        "cpu_count": os.cpu_count(), "cpus_used": settings["cpus"], "platform": platform.platform(),
        "python": platform.python_version(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),  # inherited by both sides (kljax.util.hostmem)
    }
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    print_table(summary)
    common.write_json(args.json_path, summary)
    return 0


def slow_peer_reason(settings: dict[str, Any], slowdown: float = 4.0) -> str | None:
    """Why TRL's side would not finish in reasonable time, or None: in bfloat16 (torch autocast) every
    matmul of TRL's side is a torch bfloat16 GEMM, which a CPU without native bfloat16 runs through
    a slow fallback (measured 58x below float32 on an AVX2-only EPYC: a 39-minute first iteration)."""
    if settings["dtype"] != "bfloat16" or importlib.util.find_spec("torch") is None:
        return None
    import torch

    if torch.cuda.is_available():  # TRL's side runs on the GPU
        return None
    f32, bf16 = (common.torch_matmul_gflops(d, settings["threads"]) for d in ("float32", "bfloat16"))
    if bf16 * slowdown >= f32:
        return None
    return (f"torch's bfloat16 matmul runs at {bf16:.1f} GFLOP/s on this CPU against {f32:.1f} in float32 (no native "
            f"bfloat16 support), so TRL's bf16=True side would be about {f32 / bf16:.0f}x slower than in float32; "
            "compare in float32 (--dtype float32), or pass --force-peer to run it anyway")


def _materialize_model(settings: dict[str, Any], tmp: Path) -> Path:
    """The HF checkpoint directory both sides load: `--model`, the embedded default, or a
    `random:NAME` model exported by a child process (`export_random`), so this one stays free of JAX."""
    from kljax.models.default import default_model_dir

    spec = settings["model"]
    if spec is None:
        return default_model_dir()
    if not spec.startswith(common.RANDOM_PREFIX):
        return Path(spec)
    out = tmp / "model"
    _run_child("export", dict(settings, model_dir=str(out)), tmp)
    return out


def export_random(settings: dict[str, Any]) -> None:
    """Export the random model `settings["model"]` with a tokenizer: SmolLM2's when the vocabulary
    holds it, else `save_char_tokenizer` (and bos/eos ids 1/2 to match it)."""
    from kljax.models.convert import export_hf
    from kljax.models.default import default_model_dir

    spec, smollm2 = settings["model"], default_model_dir()
    _, hf = common.parse_random_spec(spec)
    small = hf["vocab_size"] < json.loads((smollm2 / "config.json").read_text())["vocab_size"]
    if small:
        if hf["vocab_size"] < CHAR_VOCAB:
            raise ValueError(f"--model {spec!r}: vocab_size {hf['vocab_size']} is too small for the arithmetic "
                             f"prompts' character tokenizer ({CHAR_VOCAB} tokens)")
        spec += ("," if spec.count(":") > 1 else ":") + "bos_token_id=1,eos_token_id=2"
        _, hf = common.parse_random_spec(spec)
    model = common.load_model(spec, export_for_peer=False, seed=settings["seed"])
    export_hf(model.params, model.config, settings["model_dir"], hf_config=hf, tokenizer_dir=None if small else smollm2)
    if small:
        save_char_tokenizer(settings["model_dir"], CHAR_VOCAB)


def save_char_tokenizer(out_dir: str | os.PathLike, vocab_size: int = CHAR_VOCAB) -> None:
    """A character-level HF tokenizer of `vocab_size` tokens (at most 101): <pad>=0, <s>=1, </s>=2,
    <unk>=3, then digits, arithmetic symbols, letters and punctuation (enough for raw arithmetic prompts)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    chars = string.digits + " ?+-*/=:" + string.ascii_letters + ".,\n!\"#$%&'()[]{}<>_^|\\~`@;"
    vocab = {t: i for i, t in enumerate(specials + list(chars[: vocab_size - len(specials)]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: a token per character
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(out_dir)


def _run_child(side: str, settings: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run one side in a fresh interpreter; its JSON result (its output shown when it fails)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    # One CPU device, as a user's CPU run has (test set-ups simulate several).
    env["XLA_FLAGS"] = without_forced_devices(env.get("XLA_FLAGS", ""))
    inp, out = tmp / f"{side}-settings.json", tmp / f"{side}-result.json"
    inp.write_text(json.dumps(dict(settings, workdir=str(tmp))))
    print(f"kljax bench rl: running the {side} side in a subprocess ...", file=sys.stderr, flush=True)
    code = "import sys; from benchmarks.rl_child import child_main; child_main(sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", code, side, str(inp), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:  # the child's progress lines as they come (after any progress bar's \r); the rest kept
        at = line.find(PROGRESS)  # for a failure
        if at >= 0:
            print(line[at:], end="", file=sys.stderr, flush=True)
        tail = (tail + [line])[-200:]
    code_ = proc.wait()
    if code_ != 0 or not out.exists():
        raise RuntimeError(f"the {side} side failed (exit {code_}):\n{''.join(tail)[-6000:]}")
    return json.loads(out.read_text())


PROGRESS = "kljax bench rl ["


def progress(side: str, done: int, total: int, seconds: float, split: dict[str, float]) -> None:
    """One line per finished iteration of a side (the parent echoes it at once)."""
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in split.items())
    print(f"{PROGRESS}{side}]: iteration {done}/{total} in {seconds:.1f} s ({parts})", flush=True)


# ---------------------------------------------------------------- shared by both sides


def iteration_prompts(settings: dict[str, Any], tokenizer: Any) -> tuple[Any, str, list[list[Any]], list[list[str]]]:
    """The task, the prompt format and, per iteration, its examples and their prompt texts
    (rendered as `kljax.train.rollout.prompt_texts` does: chat template when there is one)."""
    from kljax.tasks.prompting import build_messages, has_chat_template, render_messages
    from kljax.tasks.registry import get_task

    task = get_task(TASK)
    task.answer_format = "answer_line"  # as configs/default.py
    fmt = "chat" if has_chat_template(tokenizer) else "raw"
    examples = [task.examples(SPLIT, n=settings["prompts"], seed=settings["seed"] * 1_000_003 + i)
                for i in range(settings["iterations"])]
    texts = [[ex.prompt if fmt == "raw" else render_messages(build_messages(ex, task), tokenizer, chat_template=True)
              for ex in step] for step in examples]
    return task, fmt, examples, texts


def model_flops(n_body: float, n_head: float, prompt_unique: float, generated: float, sequence: float,
                lora: bool = False) -> dict[str, float]:
    """Model FLOPs of one iteration's phases and their total (formulas in the module docstring);
    n_body non-embedding parameters, n_head = vocab * hidden, then the token counts P_u, T_gen, T_seq;
    `lora`: only adapters train, so the update skips the base's weight gradients (4 instead of 6)."""
    update = 4 if lora else 6
    out = {
        "sample": common.sample_flops(n_body, n_head, prompt_unique, generated),
        "score": 2 * n_body * sequence + 2 * n_head * generated,
        "update": update * n_body * sequence + update * n_head * generated,
    }
    out["total"] = sum(out.values())
    return out


def side_result(splits: list[dict[str, float]], tokens: list[dict[str, float]], params: tuple[int, int],
                 settings: dict[str, Any], optimizer_steps: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Seconds per iteration (median and spread), the split, token counts and model FLOPs.

    `splits[i]` holds the timed iteration's "total" and "cpu" seconds and its parts."""
    seconds = sorted(s["total"] for s in splits)
    mean = {k: statistics.fmean(t[k] for t in tokens) for k in tokens[0]}
    return {
        "median": statistics.median(seconds), "min": seconds[0], "max": seconds[-1],
        "iterations_per_s": common.throughput(1.0, [(s["total"], s["cpu"]) for s in splits]),
        "split": {k: statistics.median(s[k] for s in splits) for k in splits[0] if k not in ("total", "cpu")},
        "tokens_per_iteration": mean, "completions_per_iteration": mean["completions"],
        "iterations": settings["iterations"], "optimizer_steps": optimizer_steps,
        "non_embedding_params": params[0], "head_params": params[1],
        "model_flops": model_flops(*params, mean["prompt_unique"], mean["generated"], mean["sequence"],
                                   lora=bool(settings.get("lora_rank", 0))),
        **extra,
    }


# ---------------------------------------------------------------- report


def summarize(sides: dict[str, dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """The top-level JSON: medians, ratio, MFU and the per-side details."""
    k = sides["kljax"]
    peak = k["peak"]["gflops"] * 1e9
    for side in sides.values():
        side["mfu"] = side["model_flops"]["total"] / side["median"] / peak
    k["mfu_split"] = {x: k["model_flops"][x] / k["split"][x] / peak for x in ("sample", "score", "update")}
    summary: dict[str, Any] = {
        "unit": "seconds per RL iteration (median; lower is faster)", "kljax": k["median"], "mfu": k["mfu"],
        "kljax_compile_s": k["compile_s"], "peak_gflops": k["peak"]["gflops"],
    }
    if "peer" in sides:
        p = sides["peer"]
        summary.update(peer=p["median"], ratio=p["median"] / k["median"],
                       peak_memory_ratio=k["peak_rss_mb"] / p["peak_rss_mb"])
    summary.update(sides=sides, settings={x: v for x, v in settings.items() if x != "workdir"},
                   versions={**k["versions"], **sides.get("peer", {}).get("versions", {})})
    return summary


def print_table(summary: dict[str, Any]) -> None:
    s = summary["settings"]
    print(f"kljax bench rl: {s['model'] or 'SmolLM2-135M-Instruct'} on {s['task']}, {s['prompts']} prompts x "
          f"{s['group']} samples x {s['new_tokens']} new tokens, {s['repeats']} timed iterations, "
          f"{s['threads']} threads, update in {s['micro_batches']} micro-batch(es), {s['dtype']}"
          f"{'' if s['scan_layers'] else ', layers unrolled'}"
          + (f", LoRA rank {s['lora_rank']} on {','.join(s['lora_targets'])}" if s.get("lora_rank") else ""))
    print(f"{'system':10s} {'s/iter':>8s} {'min-max':>13s} {'sample':>7s} {'reward':>7s} {'score':>7s} "
          f"{'update':>7s} {'peak MiB':>9s} {'MFU':>7s} {'gen tok':>8s}")
    for key, side in summary["sides"].items():
        sp = side["split"]
        score, update = sp.get("score"), sp.get("update", sp.get("score_and_update"))
        spread = f"{side['min']:.2f}-{side['max']:.2f}"
        print(f"{'kljax' if key == 'kljax' else 'TRL GRPO':10s} {side['median']:8.2f} {spread:>13s} "
              f"{sp['sample']:7.2f} {sp['reward']:7.3f} {'' if score is None else format(score, '.2f'):>7s} "
              f"{update:7.2f} {side['peak_rss_mb']:9.0f} {100 * side['mfu']:6.2f}% "
              f"{side['tokens_per_iteration']['generated']:8.0f}")
    if "peer" in summary:
        print("(TRL's update column includes its reference log-probs, which it computes inside the step)")
        print(f"ratio (TRL s/iter / kljax s/iter): {summary['ratio']:.2f}x   "
              f"peak memory kljax / TRL: {summary['peak_memory_ratio']:.2f}")
    if "peer_skipped" in summary:
        print(f"TRL side skipped: {summary['peer_skipped']}")
    k = summary["sides"]["kljax"]
    print("kljax MFU by phase: " + ", ".join(f"{x} {100 * v:.1f}%" for x, v in k["mfu_split"].items()))
    print(f"kljax compile {k['compile_s']:.1f}s (first iteration {k['first_iteration_s']:.1f}s); "
          f"MFU against {summary['peak_gflops']:.1f} GFLOP/s ({k['peak'].get('source', '')}); "
          f"wall {summary['wall_s']:.0f}s")
