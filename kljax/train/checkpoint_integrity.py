"""Checksums of a checkpoint step directory: `checksums.json` (sha256 and size of every file under
it) written once orbax has finished the step, verified before a restore.

A step without `checksums.json` (written before checksums existed, or killed between orbax's
rename and this file) is verified by orbax's restore alone.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHECKSUMS = "checksums.json"


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(step_dir: str | os.PathLike) -> Path:
    """Write step_dir/checksums.json for the files now under it (atomically: temp file + rename)."""
    step_dir = Path(step_dir)
    table = {str(p.relative_to(step_dir)): {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in _files(step_dir)}
    tmp = step_dir / f".{CHECKSUMS}.tmp"
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, step_dir / CHECKSUMS)
    return step_dir / CHECKSUMS


def damage(step_dir: str | os.PathLike) -> str | None:
    """None when every file listed in step_dir/checksums.json is there with its size and sha256 (or
    there is no checksums.json); else what is wrong, naming the first damaged file."""
    step_dir = Path(step_dir)
    path = step_dir / CHECKSUMS
    if not step_dir.is_dir():
        return f"{step_dir} is missing"
    if not path.is_file():
        return None
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return f"{path} is unreadable ({e})"
    for name, want in sorted(table.items()):
        file = step_dir / name
        if not file.is_file():
            return f"file {name} is missing"
        if file.stat().st_size != want["bytes"]:
            return f"file {name} has {file.stat().st_size} bytes, {want['bytes']} were written (truncated or changed)"
        if _sha256(file) != want["sha256"]:
            return f"file {name} does not match its sha256 (changed on disk)"
    return None
