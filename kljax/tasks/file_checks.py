"""What is wrong with a data file, named: the checks `files._read_split_files` runs before and after
`datasets` reads a JSONL, CSV or Parquet file, so the user learns the file, the line and the cause
instead of "does not exist" or "An error occurred while generating the dataset".

    check_readable(path)        before reading: a regular file, not a directory, FIFO or device
    check_utf8(path)            before reading a text format: UTF-8 throughout (line and byte named)
    diagnose(fmt, path, error)  after `datasets` failed: the first bad line or row, or "no rows"

Each raises a `UserError` naming the file; `diagnose` returns None when it finds nothing to name.
None of them blocks: a FIFO is refused from its stat, never opened.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

from kljax.errors import UserError

CHUNK = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_readable(path: str | Path, what: str = "task.path: data file") -> None:
    """UserError unless `path` is a regular file (symlinks followed); says what it is instead."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{what} {str(path)!r} does not exist") from None
    except OSError as e:
        raise UserError(f"{what} {str(path)!r} cannot be read: {e.strerror}") from None
    if stat.S_ISREG(mode):
        return
    hint = " (a saved dataset directory is task.name='hf')" if stat.S_ISDIR(mode) else ""
    raise UserError(f"{what} {str(path)!r} is {_kind(mode)}, not a file{hint}; give a JSONL, CSV or Parquet file")


def check_utf8(path: str | Path) -> None:
    """UserError naming the line and byte of the first invalid UTF-8 sequence of a text file."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                # e.start counts from the decoder's buffered bytes (at most 3) plus this chunk.
                held = len(e.object) - len(chunk)
                bad_offset = offset - held + e.start
                line += chunk.count(b"\n", 0, max(e.start - held, 0))
                raise UserError(f"{path} is not UTF-8 text: byte 0x{e.object[e.start]:02x} at line {line} "
                                f"(byte offset {bad_offset}); save it as UTF-8") from None
            if not chunk:
                return
            offset += len(chunk)
            line += chunk.count(b"\n")


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """`datasets` logs its own error (with a traceback) for a file it cannot parse before raising;
    kljax reports the failure itself, so its log stays silent below CRITICAL meanwhile."""
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def diagnose(fmt: str, path: str | Path) -> None:
    """After `datasets` could not read `path` as `fmt`: raise a UserError naming what is wrong (no
    rows, the first ragged CSV row, the first line that is not a JSON object), else return."""
    if fmt == "parquet":
        _diagnose_parquet(path)
    elif fmt == "csv":
        _diagnose_csv(path)
    elif fmt == "jsonl":
        _diagnose_jsonl(path)


def _diagnose_parquet(path: str | Path) -> None:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(str(path)).metadata
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise UserError(f"{path} is not a Parquet file: {' '.join(str(e).split())}") from None
    if meta.num_rows == 0:
        raise UserError(f"{path} has no rows (a Parquet file with {meta.num_columns} column(s) and 0 rows)")


def _diagnose_csv(path: str | Path) -> None:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise UserError(f"{path} is empty: a CSV file needs a header line and rows")
        rows = 0
        for row in reader:
            if not row:
                continue  # a blank line
            rows += 1
            if len(row) != len(header):
                raise UserError(f"{path}: line {reader.line_num} has {len(row)} field(s) but the header has "
                                f"{len(header)} ({', '.join(header)}); quote fields that hold commas")
    if rows == 0:
        raise UserError(f"{path} has a header ({', '.join(header)}) but no rows")


def _diagnose_jsonl(path: str | Path) -> None:
    rows = 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}: line {number} is not valid JSON: {e.msg} at column {e.colno}") from None
            except RecursionError:
                raise UserError(f"{path}: line {number} nests too deeply to read") from None
            if not isinstance(value, dict):
                raise UserError(f"{path}: line {number} is a JSON {type(value).__name__}, not an object "
                                "(one row per line: {\"prompt\": ..., ...})")
            rows += 1
    if rows == 0:
        raise UserError(f"{path} has no rows")
