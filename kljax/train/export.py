"""A run's trained policy written as a Hugging Face checkpoint (`kljax export`, `save_pretrained`).

OUT gets config.json + safetensors (`kljax.models.convert.export_hf`) and the tokenizer, so that
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)`
load it. The config.json is the source checkpoint's (an HF directory, or the embedded default
model's); a run on the tiny random model gets a generated one and an HF tokenizer with the
character tokenizer's ids (`char_tokenizer_files`). A LoRA run's adapters are merged into the base,
or written as a PEFT adapter directory (`fmt="peft"`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax

from kljax.errors import UserError
from kljax.models.convert import export_hf, read_hf_config
from kljax.models.default import default_model_dir
from kljax.models.lora import merge
from kljax.models.peft_export import write_peft_adapter
from kljax.train.restore import restore_params
from kljax.util.owned_paths import check_apart, check_output, check_writable, mark, remove_marked

EXPORT_RECORD = "kljax_export.json"  # the run and step an export came from; also marks it as written by export
EXPORT_FORMATS = ("merged", "peft")
EXPORT_DTYPES = ("float32", "bfloat16")


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


def _check_out(workdir: str | Path, out: Path, overwrite: bool) -> Path:
    """The resolved --out (symbolic links followed), checked by the one rule of every writer
    (`owned_paths.check_output`): apart from the run, and replacing only an earlier export."""
    check_apart(out, workdir, "--out", "the run")
    return check_output(out.resolve(), "--out", overwrite=overwrite, directory=True, legacy=(EXPORT_RECORD,))


def _export(params: Any, model: Any, out: Path, fmt: str, hf_config: Any, dtype: str | None, tokenizer_dir: Any,
            base_path: str) -> Path:
    """An HF checkpoint of the policy (a LoRA run's adapters merged into the base: `lora.merge`), or with
    fmt 'peft' a LoRA run's PEFT adapter directory for its base (`kljax.models.peft_export`)."""
    if fmt == "peft":
        if model.lora is None:
            raise UserError("--format peft: this run has no LoRA adapters (model.lora.rank is 0); "
                            "--format merged writes the full model")
        return write_peft_adapter(params, model, out, None if base_path == "tiny" else base_path)
    if model.lora is not None:
        params, model = merge(params, model), dataclasses.replace(model, lora=None)
    return export_hf(params, model, out, hf_config=hf_config, dtype=dtype, tokenizer_dir=tokenizer_dir)


def export_run(workdir: str | Path, out: str | Path, step: int | None = None, dtype: str | None = None,
               overwrite: bool = False, overrides: list[str] | None = None, fmt: str = "merged") -> tuple[Path, int]:
    """Write checkpoint `step` (default: the latest) of `workdir` to `out` as an HF checkpoint; (out, step).

    Written into a new directory next to `out` and renamed into place, so an existing export is
    replaced only once the new one is complete, and only when `_check_out` allows it."""
    if not str(out).strip():  # Path("") would be the working directory
        raise UserError("--out '' is empty; give a directory path for the Hugging Face checkpoint")
    real = _check_out(workdir, Path(out), overwrite)
    check_writable(real, "--out")  # a read-only or forbidden place: one line naming --out, before reading the run
    params, policy, config, step = restore_params(workdir, step, overrides=overrides or ())
    source = str(config.model.source)
    real.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{real.name}.export-", dir=real.parent))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if source == "tiny":
                hf_config, tokenizer_dir = None, char_tokenizer_files(policy.tokenizer, tmp)
            else:
                if source == "default":
                    source = str(default_model_dir())
                hf_config, tokenizer_dir = read_hf_config(source), source
            written = _export(params, policy.model, staging / "hf", fmt, hf_config, dtype, tokenizer_dir, source)
        if jax.process_index() == 0:
            (written / EXPORT_RECORD).write_text(json.dumps({"workdir": str(workdir), "step": step}, indent=2) + "\n")
            mark(written, "kljax export")
            if real.is_dir() and any(real.iterdir()):
                old = staging / "replaced"
                os.replace(real, old)  # checked by _check_out: an earlier export
                os.replace(written, real)
                remove_marked(old, "--out", legacy=(EXPORT_RECORD,))
            else:
                os.replace(written, real)  # a new or empty directory
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # kljax's own temporary directory
    return Path(out), step
