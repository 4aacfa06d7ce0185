"""`kljax convert`: HF checkpoint dir -> kljax orbax dir, `--export` back, `--check` logit parity.

    kljax convert --model HF_DIR --out DIR          HF safetensors -> orbax params (+ config, tokenizer)
    kljax convert --export --model DIR --out HF_DIR  orbax params -> HF safetensors loadable by transformers
    kljax convert --check [--model HF_DIR]           max |logits - transformers logits|; last line
                                                     `max_abs_diff=<x>`, exit 1 above --tolerance
    kljax convert --default-model                    build (once) and print the embedded SmolLM2 dir
Without --model, the embedded SmolLM2-135M-Instruct is used.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint dir (or, with --export, a kljax orbax dir); "
                        "default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--out", help="output directory")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--export", action="store_true", help="kljax orbax dir -> HF safetensors dir")
    mode.add_argument("--check", action="store_true", help="compare logits with transformers (float32)")
    mode.add_argument("--default-model", action="store_true", help="print the embedded model's HF dir")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="--check: max allowed abs diff")
    parser.add_argument("--prompt", action="append", help="--check: a prompt (repeatable)")
    parser.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype of converted params (and of exported tensors)")


def run(args: argparse.Namespace) -> int:
    from kljax.models.default import default_model_dir

    if args.default_model:
        print(default_model_dir())
        return 0
    model_dir = args.model or str(default_model_dir())
    if args.check:
        from kljax.models.convert import read_hf_config
        from kljax.models.parity import DEFAULT_PROMPTS, compare_with_transformers, prompt_token_ids

        vocab = int(read_hf_config(model_dir)["vocab_size"])
        tokens = prompt_token_ids(model_dir, args.prompt or DEFAULT_PROMPTS, vocab_size=vocab)
        worst, per_prompt = compare_with_transformers(model_dir, tokens)
        for i, d in enumerate(per_prompt):
            print(f"prompt {i} ({len(tokens[i])} tokens): max_abs_diff={d:.3e}")
        print(f"tolerance={args.tolerance:g} {'OK' if worst <= args.tolerance else 'FAILED'}")
        print(f"max_abs_diff={worst:.6e}")
        return 0 if worst <= args.tolerance else 1
    if not args.out:
        raise SystemExit("kljax convert: --out is required to convert or export")
    if args.export:
        from kljax.models.convert import export_hf, read_hf_config
        from kljax.models.orbax_params import load_orbax_model

        params, config = load_orbax_model(model_dir, param_dtype=args.param_dtype)
        hf_config = read_hf_config(model_dir)
        out = export_hf(params, config, args.out, hf_config=hf_config, tokenizer_dir=model_dir)
        print(out)
        return 0
    from kljax.models.convert import check_vocab, load_hf_checkpoint, read_hf_config
    from kljax.models.orbax_params import save_orbax_model
    from kljax.models.parity import has_tokenizer

    params, config = load_hf_checkpoint(model_dir, param_dtype=args.param_dtype)
    if has_tokenizer(model_dir):
        from transformers import AutoTokenizer

        check_vocab(config, len(AutoTokenizer.from_pretrained(model_dir)))
    out = save_orbax_model(args.out, params, read_hf_config(model_dir), tokenizer_dir=model_dir)
    print(out)
    return 0
