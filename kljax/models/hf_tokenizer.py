"""The tokenizer of a Hugging Face checkpoint directory, or a UserError naming the directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kljax.errors import UserError

TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_hf_tokenizer(model_dir: str | os.PathLike) -> Any:
    """`AutoTokenizer.from_pretrained(model_dir)`, local files only. A directory without tokenizer
    files, or whose files transformers cannot read, is a UserError naming it."""
    if not any((Path(model_dir) / n).is_file() for n in TOKENIZER_MARKERS):
        raise UserError(f"{model_dir} has no tokenizer (none of {', '.join(TOKENIZER_MARKERS)})")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # transformers raises many types for unreadable files
        raise UserError(f"the tokenizer in {model_dir} cannot be loaded: {type(e).__name__}: {e}") from e
