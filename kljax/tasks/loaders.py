"""Reading the evaluation and training sets: from a local data directory, or by hub name.

The data directory is, in order: the `data_dir` argument; the environment variable `KLJAX_DATA_DIR`;
`../shared/data` beside the repository root (the offline copy), when it exists. Its layout (JSONL):

    math/train.jsonl       7,500   problem, answer, level, type
    math500/test.jsonl       500   problem, solution, answer, subject, level, unique_id
    gsm8k/train.jsonl      7,473   question, answer ("... #### 72")
    gsm8k/test.jsonl       1,319
    mmlu_stem/test.jsonl   3,018   question, type (subject), choices, answer (index)

Every line is validated as written (a missing field, an empty prompt or a value of the wrong type is a
ValueError naming the file and the row, 1-based by line), then the file is read with
`datasets.load_dataset("json", data_files=...)` (or kept as parsed when `datasets` is not installed).
`hub=True` reads the same sets from the Hugging Face hub by name (`Source.hub` in `SOURCES`; needs internet).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kljax.tasks.answers import last_boxed

DATA_DIR_ENV = "KLJAX_DATA_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA_DIR = REPO_ROOT.parent / "shared" / "data"

Row = dict[str, Any]


class DataNotFoundError(FileNotFoundError):
    """The data directory or a data file is missing (the message says where it looked and how to fix)."""


def default_data_dir() -> Path | None:
    """`$KLJAX_DATA_DIR` when set, else `../shared/data` beside the repository when it exists, else None."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return SHARED_DATA_DIR if SHARED_DATA_DIR.is_dir() else None


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data directory to read (see the module docstring); raises DataNotFoundError when missing."""
    if data_dir is not None:
        path, origin = Path(data_dir).expanduser(), "the data_dir argument"
    elif os.environ.get(DATA_DIR_ENV):
        path, origin = Path(os.environ[DATA_DIR_ENV]).expanduser(), f"${DATA_DIR_ENV}"
    else:
        path, origin = SHARED_DATA_DIR, "the default (../shared/data beside the repository)"
    if not path.is_dir():
        raise DataNotFoundError(
            f"data directory {path} (from {origin}) does not exist; set {DATA_DIR_ENV} to the directory "
            f"holding math/, math500/, gsm8k/ and mmlu_stem/, or pass data_dir=, or use hub=True"
        )
    return path


@dataclasses.dataclass(frozen=True)
class Field:
    """A required (or optional) field of a row and the types it may have."""

    name: str
    types: tuple[type, ...] = (str,)
    required: bool = True
    nonempty: bool = False


@dataclasses.dataclass(frozen=True)
class Source:
    """One local file and its hub equivalent.

    local:    path inside the data directory
    fields:   the fields every row must have (validated)
    hub:      (path, config or None, split) for `datasets.load_dataset`
    from_hub: maps a hub row to the local row layout (None: same layout)
    """

    local: str
    fields: tuple[Field, ...]
    hub: tuple[str, str | None, str]
    from_hub: Callable[[Row], Row] | None = None


def _math_from_hub(row: Row) -> Row:

    return {**row, "answer": last_boxed(row.get("solution") or "") or ""}


def _mmlu_from_hub(row: Row) -> Row:
    return {**row, "type": row.get("subject", "")}


# MATH train has two rows whose answer is empty (5342 and 5344: the source lost their boxed choice),
# so an empty answer is valid here; `benchmarks.MathTask` leaves such rows out of its examples.
_MATH_FIELDS = (Field("problem", nonempty=True), Field("answer"))
_GSM8K_FIELDS = (Field("question", nonempty=True), Field("answer", nonempty=True))
_MMLU_FIELDS = (
    Field("question", nonempty=True),
    Field("choices", (list,)),
    Field("answer", (int,)),
    Field("type"),
)

SOURCES: dict[str, Source] = {
    "math/train": Source(
        "math/train.jsonl",
        (*_MATH_FIELDS, Field("level", required=False), Field("type", required=False)),
        ("DigitalLearningGmbH/MATH-lighteval", None, "train"),
        _math_from_hub,
    ),
    "math500/test": Source(
        "math500/test.jsonl",
        (*_MATH_FIELDS, Field("unique_id", nonempty=True), Field("level", (int, str), required=False)),
        ("HuggingFaceH4/MATH-500", None, "test"),
    ),
    "gsm8k/train": Source("gsm8k/train.jsonl", _GSM8K_FIELDS, ("openai/gsm8k", "main", "train")),
    "gsm8k/test": Source("gsm8k/test.jsonl", _GSM8K_FIELDS, ("openai/gsm8k", "main", "test")),
    "mmlu_stem/test": Source("mmlu_stem/test.jsonl", _MMLU_FIELDS, ("cais/mmlu", "{subject}", "test"), _mmlu_from_hub),
}


def validate_row(row: Any, fields: tuple[Field, ...], where: str) -> Row:
    """Check one row against `fields`; raise ValueError naming `where` (file and row) on a problem."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for f in fields:
        value = row.get(f.name)
        if value is None:
            if f.required:
                raise ValueError(f"{where}: missing field {f.name!r}")
            continue
        if not isinstance(value, f.types) or (bool not in f.types and isinstance(value, bool)):
            want = " or ".join(t.__name__ for t in f.types)
            raise ValueError(f"{where}: field {f.name!r} should be {want}, got {type(value).__name__} {value!r:.60}")
        if f.nonempty and isinstance(value, str) and not value.strip():
            raise ValueError(f"{where}: field {f.name!r} is empty")
    return row


def _scan_jsonl(path: Path, fields: tuple[Field, ...]) -> list[Row]:
    """Read and validate a JSONL file line by line (blank lines skipped; rows numbered by line)."""
    rows: list[Row] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, row {line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            rows.append(validate_row(row, fields, where))
    return rows


def read_jsonl(path: str | os.PathLike[str], fields: tuple[Field, ...], use_datasets: bool = True) -> list[Row]:
    """The validated rows of a local JSONL file.

    Every line is first parsed with `json` and validated (so a wrong type is reported as written, not
    as `datasets` would coerce it); the rows are then read with `datasets.load_dataset("json", ...)`
    when `use_datasets` and `datasets` is installed, else returned as parsed.
    """
    path = Path(path)
    if not path.is_file():
        raise DataNotFoundError(
            f"data file {path} does not exist; the data directory comes from the data_dir argument, "
            f"${DATA_DIR_ENV} or ../shared/data beside the repository (see kljax/tasks/loaders.py)"
        )
    rows = _scan_jsonl(path, fields)
    if not rows:
        raise ValueError(f"data file {path} has no rows (it is empty or only blank lines)")
    if not use_datasets:
        return rows
    try:
        from datasets import load_dataset
    except ImportError:
        return rows
    loaded = load_dataset("json", data_files=str(path), split="train").to_list()
    if len(loaded) != len(rows):
        raise ValueError(f"{path}: datasets read {len(loaded)} rows but the file has {len(rows)}")
    return loaded


def load_rows(
    source: str, data_dir: str | os.PathLike[str] | None = None, hub: bool = False, **hub_format: str
) -> list[Row]:
    """Validated rows of a named source ("math/train", "math500/test", "gsm8k/test", ...; see `SOURCES`).

    Local by default (see `resolve_data_dir`); `hub=True` loads by hub name instead (needs internet;
    `hub_format` fills the hub config template, e.g. subject="college_physics" for MMLU).
    """
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; valid sources: {sorted(SOURCES)}")
    spec = SOURCES[source]
    if not hub:
        return read_jsonl(resolve_data_dir(data_dir) / spec.local, spec.fields)
    from datasets import load_dataset

    path, config, split = spec.hub
    config = config.format(**hub_format) if config else None
    rows = load_dataset(path, config, split=split).to_list()
    if spec.from_hub is not None:
        rows = [spec.from_hub(row) for row in rows]
    where = f"hub {path} {config or ''} {split}"
    return [validate_row(row, spec.fields, f"{where}, row {i}") for i, row in enumerate(rows, start=1)]
