"""`kljax generate`: greedy text from a model directory (HF checkpoint or kljax orbax dir), or a run.

    kljax generate [--model DIR] --prompt "..." [--max-new-tokens N] [--chat]
    kljax generate --checkpoint WORKDIR [--step N] --prompt "..."   (a run's policy, prompted as in the run)

Without --model, the embedded SmolLM2-135M-Instruct is used. With --checkpoint, each --prompt is the
user message of the run's prompts: its system prompt, answer-format line and prompt format (chat
template, plain or raw) from WORKDIR/config.json; the data files of a file task are not needed.
"""

from __future__ import annotations

import argparse
from typing import Any

from kljax.config.run import RunConfig
from kljax.errors import UserError
from kljax.models.convert import check_hf_dir, check_vocab, load_hf_checkpoint, model_config_from_dir
from kljax.models.default import default_model_dir
from kljax.models.hf_tokenizer import load_hf_tokenizer
from kljax.models.orbax_params import is_orbax_model, load_orbax_model
from kljax.sampling import greedy_continuations
from kljax.tasks.base import Example
from kljax.tasks.files import FORMATS
from kljax.tasks.from_config import task_of
from kljax.tasks.prompting import ANSWER_FORMATS, render_messages
from kljax.train.export import is_run_workdir, workdir_hint
from kljax.train.restore import restore_params
from kljax.train.rollout import prompt_texts


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint or kljax orbax dir, or 'default' (the embedded SmolLM2, "
                                        "the default)")
    parser.add_argument("--checkpoint", metavar="WORKDIR",
                        help="a `kljax train` workdir: its checkpoint, prompted as the run was")
    parser.add_argument("--step", type=int, default=None, help="with --checkpoint: this step instead of the latest")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="compute and param dtype")


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens={args.max_new_tokens} must be >= 1")
    empty = [i for i, p in enumerate(args.prompt) if not p]
    if empty:
        raise UserError(f"--prompt number {empty[0] + 1} is empty; give some text")
    if args.checkpoint:
        if args.model:
            raise UserError("give --model or --checkpoint, not both")
        return run_checkpoint(args)
    model_dir = str(default_model_dir()) if args.model in (None, "default") else args.model
    if is_run_workdir(model_dir):
        raise UserError(workdir_hint(model_dir))
    orbax = is_orbax_model(model_dir)
    dtypes = dict(param_dtype=args.dtype, dtype=args.dtype)
    config = model_config_from_dir(model_dir, **dtypes) if orbax else check_hf_dir(model_dir, **dtypes)
    tokenizer = load_hf_tokenizer(model_dir)
    check_vocab(config, len(tokenizer))
    load = load_orbax_model if orbax else load_hf_checkpoint
    params, config = load(model_dir, **dtypes)
    if args.chat:
        prompts = [
            list(tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
            ))
            for p in args.prompt
        ]
    else:
        prompts = [tokenizer.encode(p) for p in args.prompt]
    _check_room(args.max_new_tokens, config.max_position_embeddings)
    for i, ids in enumerate(prompts):
        if not ids:
            raise UserError(f"--prompt number {i + 1} ({args.prompt[i]!r}) encodes to no tokens")
        if len(ids) + args.max_new_tokens > config.max_position_embeddings:
            raise UserError(
                f"--prompt number {i + 1} has {len(ids)} tokens; with --max-new-tokens={args.max_new_tokens} that "
                f"exceeds the model's context of {config.max_position_embeddings}"
            )
    eos = set(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (tokenizer.pad_token_id or 0)
    outputs = greedy_continuations(params, config, prompts, args.max_new_tokens, sorted(eos), pad)
    for i, ids in enumerate(outputs):
        if len(outputs) > 1:
            print(f"--- {i}")
        print(tokenizer.decode(ids, skip_special_tokens=True))
    return 0


def prompt_texts_for(config: RunConfig, tokenizer: Any, prompts: list[str]) -> list[str]:
    """The text the run would have fed the model for each prompt (see the module docstring)."""
    t = config.task
    fmt = t.prompt_format
    if t.name not in FORMATS:
        task = task_of(config)
        return prompt_texts([Example(p, "", task.name, "train", str(i)) for i, p in enumerate(prompts)], task,
                            tokenizer, fmt)
    if fmt == "raw":
        return list(prompts)
    system = t.system_prompt or ""  # the user's data: a system prompt only when asked
    line = f"\n\n{ANSWER_FORMATS[t.answer_format]}" if t.answer_format else ""
    if fmt == "auto" and not system:  # standard prompts as written (kljax.tasks.prompting)
        return [p.strip() + line if line else p for p in prompts]
    return [render_messages(([{"role": "system", "content": system}] if system else [])
                            + [{"role": "user", "content": p.strip() + line}], tokenizer,
                            chat_template={"chat": True, "plain": False}.get(fmt))
            for p in prompts]


def run_checkpoint(args: argparse.Namespace) -> int:
    """Print the greedy completion of each --prompt by WORKDIR's checkpoint (--step, default latest)."""
    params, policy, config, step = restore_params(args.checkpoint, args.step)
    texts = prompt_texts_for(config, policy.tokenizer, list(args.prompt))
    _check_room(args.max_new_tokens, policy.model.max_position_embeddings)
    ids = []
    for i, text in enumerate(texts):
        toks = list(policy.tokenizer.encode(text, add_special_tokens=False))
        if not toks or len(toks) + args.max_new_tokens > policy.model.max_position_embeddings:
            raise UserError(f"--prompt number {i + 1} has {len(toks)} tokens after the run's templating; it must "
                             f"have 1 to {policy.model.max_position_embeddings - args.max_new_tokens} with "
                             f"--max-new-tokens={args.max_new_tokens}")
        ids.append(toks)
    outputs = greedy_continuations(params, policy.model, ids, args.max_new_tokens, list(policy.stop_token_ids),
                              policy.pad_id)
    for i, out in enumerate(outputs):
        if len(outputs) > 1:
            print(f"--- {i}")
        print(policy.tokenizer.decode(list(out), skip_special_tokens=True))
    return 0


def _check_room(max_new_tokens: int, context: int) -> None:
    """--max-new-tokens must leave the prompt at least one position of the model's context."""
    if max_new_tokens >= context:
        raise UserError(f"--max-new-tokens={max_new_tokens} leaves no room for a prompt in the model's context of "
                        f"{context} tokens; give at most {context - 1}")
