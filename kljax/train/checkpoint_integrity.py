"""Checksums of a checkpoint step directory: `checksums.json` (sha256 and size of every file under
it) written once orbax has finished the step, verified before a restore.

The step's JSON meta (inside orbax's atomic write) carries `PROMISE: true`, so a step that lacks
`checksums.json` although its meta promises one (the run was killed between orbax's rename and
the checksum write, or the file was deleted) is damaged: it is never restored unverified. A step
whose meta has no such key was written by a kljax before checkpoint checksums (or before this
promise); without checksums.json it is verified by orbax's restore alone, as then.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHECKSUMS = "checksums.json"
PROMISE = "checksums_follow"  # meta key: this step gets a checksums.json right after orbax's write
META_FILE = ("meta", "metadata")  # where orbax's JsonSave puts the step's meta


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


def _promised(step_dir: Path) -> bool:
    """Whether the step's meta says a checksums.json was to follow (False when unreadable: orbax decides)."""
    try:
        meta = json.loads(step_dir.joinpath(*META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get(PROMISE) is True


def damage(step_dir: str | os.PathLike) -> str | None:
    """None when every file listed in step_dir/checksums.json is there with its size and sha256 (or
    there is no checksums.json and the meta does not promise one: an older kljax's checkpoint); else
    what is wrong, naming the first damaged file."""
    step_dir = Path(step_dir)
    path = step_dir / CHECKSUMS
    if not step_dir.is_dir():
        return f"{step_dir} is missing"
    if not path.is_file():
        if _promised(step_dir):
            return (f"{CHECKSUMS} is missing (the run was killed before it was written, or it was deleted): "
                    "refused unverified")
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
