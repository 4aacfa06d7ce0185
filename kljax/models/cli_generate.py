"""`kljax generate`: greedy text from a model directory (HF checkpoint or kljax orbax dir).

    kljax generate [--model DIR] --prompt "..." [--max-new-tokens N] [--chat]
Without --model, the embedded SmolLM2-135M-Instruct is used.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint or kljax orbax dir (default: embedded SmolLM2)")
    parser.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="compute and param dtype")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from kljax.models.convert import check_vocab, load_hf_checkpoint
    from kljax.models.default import default_model_dir
    from kljax.models.greedy import greedy_generate
    from kljax.models.orbax_params import is_orbax_model, load_orbax_model

    model_dir = args.model or str(default_model_dir())
    load = load_orbax_model if is_orbax_model(model_dir) else load_hf_checkpoint
    params, config = load(model_dir, param_dtype=args.dtype, dtype=args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    check_vocab(config, len(tokenizer))
    if args.chat:
        prompts = [
            list(tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
            ))
            for p in args.prompt
        ]
    else:
        prompts = [tokenizer.encode(p) for p in args.prompt]
    eos = set(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    pad = config.pad_token_id if config.pad_token_id is not None else (tokenizer.pad_token_id or 0)
    outputs = greedy_generate(params, config, prompts, args.max_new_tokens, sorted(eos), pad)
    for i, ids in enumerate(outputs):
        if len(outputs) > 1:
            print(f"--- {i}")
        print(tokenizer.decode(ids, skip_special_tokens=True))
    return 0
