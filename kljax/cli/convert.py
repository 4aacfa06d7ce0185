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
import math
from pathlib import Path

from kljax.errors import UserError
from kljax.models.convert import (
    check_hf_dir,
    check_vocab,
    export_hf,
    load_hf_checkpoint,
    model_config_from_dir,
    read_hf_config,
)
from kljax.models.default import default_model_dir
from kljax.models.hf_tokenizer import load_hf_tokenizer
from kljax.models.orbax_params import is_orbax_model, load_orbax_model, save_orbax_model
from kljax.studies.parity import DEFAULT_PROMPTS, compare_with_transformers, has_tokenizer, prompt_token_ids
from kljax.train.export import is_run_workdir, workdir_hint
from kljax.util.owned_paths import check_output, mark, remove_marked


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF checkpoint dir (or, with --export, a kljax orbax dir); "
                        "default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--out", help="output directory (new or empty; --overwrite replaces an earlier kljax output)")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out that kljax wrote before")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--export", action="store_true", help="kljax orbax dir -> HF safetensors dir")
    mode.add_argument("--check", action="store_true", help="compare logits with transformers (float32)")
    mode.add_argument("--default-model", action="store_true", help="print the embedded model's HF dir")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="--check: max allowed abs diff")
    parser.add_argument("--prompt", action="append", help="--check: a prompt (repeatable)")
    parser.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="dtype of converted params (and of exported tensors)")


def run(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise UserError(f"--tolerance={args.tolerance:g} must be a finite number >= 0 (the largest allowed "
                        "|logit difference| of --check)")
    if args.default_model:
        print(default_model_dir())
        return 0
    model_dir = args.model or str(default_model_dir())

    if is_run_workdir(model_dir):
        raise UserError(workdir_hint(model_dir))
    if args.check:
        check_hf_dir(model_dir)
        if has_tokenizer(model_dir):
            load_hf_tokenizer(model_dir)
        vocab = int(read_hf_config(model_dir)["vocab_size"])
        tokens = prompt_token_ids(model_dir, args.prompt or DEFAULT_PROMPTS, vocab_size=vocab)
        worst, per_prompt = compare_with_transformers(model_dir, tokens)
        for i, d in enumerate(per_prompt):
            print(f"prompt {i} ({len(tokens[i])} tokens): max_abs_diff={d:.3e}")
        print(f"tolerance={args.tolerance:g} {'OK' if worst <= args.tolerance else 'FAILED'}")
        print(f"max_abs_diff={worst:.6e}")
        return 0 if worst <= args.tolerance else 1

    if args.out is None:
        raise UserError("--out is required to convert or export")
    # the one rule of every writer: not the model it reads, nothing kljax did not write
    out = check_output(args.out, "--out", overwrite=args.overwrite, directory=True, reads=[model_dir],
                       read_what="the model it reads")
    if args.export:
        if not is_orbax_model(model_dir):
            raise UserError(f"--export --model {model_dir} is not a kljax orbax model dir (params/ + config.json)")
        model_config_from_dir(model_dir, param_dtype=args.param_dtype)
        params, config = load_orbax_model(model_dir, param_dtype=args.param_dtype)
        hf_config = read_hf_config(model_dir)
        _clear(out)
        written = export_hf(params, config, out, hf_config=hf_config, tokenizer_dir=model_dir)
        mark(written, "kljax convert --export")
        print(written)
        return 0
    config = check_hf_dir(model_dir, param_dtype=args.param_dtype)
    if has_tokenizer(model_dir):
        check_vocab(config, len(load_hf_tokenizer(model_dir)))
    params, config = load_hf_checkpoint(model_dir, param_dtype=args.param_dtype)
    _clear(out)
    written = save_orbax_model(out, params, read_hf_config(model_dir), tokenizer_dir=model_dir)
    mark(written, "kljax convert")
    print(written)
    return 0


def _clear(out: Path) -> None:
    """Remove an earlier kljax output at `out` (checked by `check_output`: only one kljax marked)."""
    if out.is_dir() and any(out.iterdir()):
        remove_marked(out, "--out")
