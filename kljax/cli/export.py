"""`kljax export WORKDIR --out DIR [--step N]`: a run's trained policy as a Hugging Face checkpoint.

DIR gets config.json + safetensors (`kljax.models.convert.export_hf`) and the tokenizer, so that
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)`
load it. The config.json is the source checkpoint's (an HF directory, or the embedded default
model's); a run on the tiny random model gets a generated one and an HF tokenizer with the
character tokenizer's ids (`char_tokenizer_files`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

ACCEPTS_CONFIG_OVERRIDES = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", help="a `kljax train` workdir")
    parser.add_argument("--out", required=True, help="output directory (must be new or empty, or pass --overwrite)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint step (default: the latest)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="dtype of the written tensors (default: the run's param dtype)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def is_run_workdir(path: str | Path) -> bool:
    """Whether `path` is a `kljax train` workdir (its config.json and checkpoints/), not a model directory."""
    return (Path(path) / "checkpoints").is_dir() and (Path(path) / "config.json").is_file()


def workdir_hint(path: str | Path) -> str:
    """What to do with a train workdir given where a model directory is expected."""
    return (f"{path} is a `kljax train` workdir, not a model directory: `kljax export {path} --out DIR` writes "
            f"its policy as a Hugging Face checkpoint; eval and generate take --checkpoint {path}")


def char_tokenizer_files(tokenizer: Any, out_dir: str | Path) -> Path:
    """Save a `transformers` fast tokenizer with the ids of a `kljax.models.tokenizers.CharTokenizer`
    (<pad> 0, </s> 1, then one token per character of its alphabet)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": tokenizer.pad_token_id, "</s>": tokenizer.eos_token_id}
    vocab.update({ch: i + 2 for i, ch in enumerate(tokenizer.alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per character
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>").save_pretrained(str(out_dir))
    return Path(out_dir)


def export_run(workdir: str | Path, out: str | Path, step: int | None = None, dtype: str | None = None,
               overwrite: bool = False, overrides: list[str] | None = None) -> tuple[Path, int]:
    """Write checkpoint `step` (default: the latest) of `workdir` to `out` as an HF checkpoint; (out, step)."""
    from kljax.models.convert import export_hf, read_hf_config
    from kljax.studies import evaluate as ev

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"--out {out} exists and is not empty; pass --overwrite to replace it")
    params, policy, config, step = ev.restore_params(workdir, step, overrides=overrides or ())
    source = str(config.model.source)
    with tempfile.TemporaryDirectory() as tmp:
        if source == "tiny":
            hf_config, tokenizer_dir = None, char_tokenizer_files(policy.tokenizer, tmp)
        else:
            if source == "default":
                from kljax.models.default import default_model_dir

                source = str(default_model_dir())
            hf_config, tokenizer_dir = read_hf_config(source), source
        written = export_hf(params, policy.model, out, hf_config=hf_config, dtype=dtype, tokenizer_dir=tokenizer_dir,
                            overwrite=True)
    (written / "kljax_export.json").write_text(json.dumps({"workdir": str(workdir), "step": step}, indent=2) + "\n")
    return written, step


def run(args: argparse.Namespace) -> int:
    out, step = export_run(args.workdir, args.out, args.step, args.dtype, args.overwrite,
                           list(getattr(args, "overrides", [])))
    print(f"exported step {step} of {args.workdir} to {out}")
    return 0
