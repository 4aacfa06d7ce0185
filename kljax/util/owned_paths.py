"""What kljax may write over or delete: only directories it created, never the run it reads.

    MARKER                        ".kljax-written": a file kljax puts in a directory when it creates it
    mark(directory, what)         write the marker (on the fresh directory, before it is renamed into place)
    is_marked(directory, legacy)  a real directory (not a symbolic link) holding the marker, or one of
                                  the `legacy` files that older kljax versions wrote there
    remove_marked(directory, ...) shutil.rmtree only such a directory; anything else is a UserError
    check_apart(out, run)         an output that is, contains or lies inside a run it reads (symbolic
                                  links resolved) is a UserError
    single_component(name, what)  a name used as one path component ("a/b", "..", "" refused)
    claim_run_dir(workdir)        before a new run writes config.json, metrics.jsonl, samples.jsonl ...:
                                  refuse a directory where kljax did not write them
    check_writable(path, what)    a read-only or forbidden place is a UserError naming `what`
    check_output(path, what, ...) the one rule of every writer: never a file of the run it reads,
                                  never over a file or directory kljax did not write unless told
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from kljax.errors import REASONS, UserError

MARKER = ".kljax-written"


def mark(directory: str | os.PathLike, what: str) -> Path:
    """Write DIRECTORY/.kljax-written saying which kljax job created the directory. Call it on the fresh
    directory before it is renamed into place, so the directory is never there without it."""
    path = Path(directory) / MARKER
    path.write_text(json.dumps({"written_by": "kljax", "what": what}) + "\n")
    return path


def is_marked(directory: str | os.PathLike, legacy: Iterable[str] = ()) -> bool:
    """Whether `directory` is a real directory (a symbolic link is not) holding MARKER or a `legacy` file."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return False
    return any((directory / name).exists() and not (directory / name).is_symlink() for name in (MARKER, *legacy))


def remove_marked(directory: str | os.PathLike, what: str, legacy: Iterable[str] = ()) -> None:
    """shutil.rmtree(directory) when kljax created it (`is_marked`); a UserError naming it otherwise."""
    directory = Path(directory)
    legacy = tuple(legacy)
    if not is_marked(directory, legacy):
        kind = "a symbolic link" if directory.is_symlink() else "not a directory kljax wrote"
        names = " or ".join((MARKER, *legacy))
        raise UserError(f"{what} {directory} is {kind} (no {names} in it): kljax does not delete it; "
                        "move it away yourself or choose another path")
    shutil.rmtree(directory)


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_apart(out: str | os.PathLike, run: str | os.PathLike, out_flag: str = "--out",
                run_what: str = "the run") -> None:
    """A UserError when `out` is `run`, lies inside it or contains it (both resolved, symbolic links
    followed), so writing or replacing `out` cannot delete what is read from `run`."""
    out_r, run_r = Path(out).resolve(), Path(run).resolve()
    if _within(out_r, run_r):
        where = "is" if out_r == run_r else "lies inside"
        raise UserError(f"{out_flag} {out} {where} {run_what} {run} ({out_r}); writing there would replace "
                        "what is read: give a directory outside it")
    if _within(run_r, out_r):
        raise UserError(f"{out_flag} {out} contains {run_what} {run} ({run_r}); writing there would replace "
                        "what is read: give a directory outside it")


def single_component(name: str, what: str) -> str:
    """`name` when it is usable as one path component; a UserError naming `what` otherwise."""
    bad = (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
           or (os.altsep is not None and os.altsep in name))
    if bad:
        raise UserError(f"{what} {name!r} is not a single path component (no '/', '\\', '.', '..' or empty "
                        "name): it names a directory")
    return name


RUN_FILES = ("config.json", "metrics.jsonl", "samples.jsonl", "eval_before.json", "eval_after.json",
             "exact_before.json")  # what a new run writes over or deletes in its workdir
LEGACY_RUN = ("eval_before.json", "checkpoints")  # a run of a kljax before the marker


def check_claimable(workdir: str | os.PathLike) -> None:
    """A UserError when WORKDIR holds files a new run writes over (RUN_FILES) that kljax did not write
    (no MARKER, no earlier run's LEGACY_RUN)."""
    workdir = Path(workdir)
    clashing = [n for n in RUN_FILES if (workdir / n).exists() or (workdir / n).is_symlink()]
    if clashing and not is_marked(workdir, LEGACY_RUN):
        raise UserError(f"--workdir {workdir} holds {', '.join(clashing)} but no kljax run ({MARKER}): a new run "
                        "would overwrite them; give a new or empty directory")


def claim_run_dir(workdir: str | os.PathLike) -> None:
    """Mark WORKDIR as a kljax run before a new run writes there (`check_claimable` first)."""
    workdir = Path(workdir)
    check_claimable(workdir)
    if not (workdir / MARKER).is_file():
        mark(workdir, "kljax train run")


def check_writable(path: str | os.PathLike, what: str) -> None:
    """UserError when `path` could not be written: its nearest existing directory is on a read-only
    file system or not writable (checked with access(2), which reports EROFS even for root)."""
    target = Path(path)
    directory = target if target.is_dir() else target.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        raise UserError(f"{what} {path}: {directory} is not a directory")
    if os.access(directory, os.W_OK):
        return
    try:  # access() says no: ask the file system why
        os.statvfs(directory)
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    code = errno.EROFS if read_only else errno.EACCES
    reason, todo = REASONS[code]
    raise UserError(f"{what} {path}: cannot write in {directory}: {reason} (errno {code}, "
                    f"{errno.errorcode[code]}); {todo}")


WRITTEN_BY = "written_by"  # the key of a JSON file kljax writes, and the text chunk of its PNGs


def written_by_kljax(path: str | os.PathLike) -> bool:
    """Whether the file at `path` is one kljax wrote: a JSON object with "written_by": "kljax ...", or
    a PNG whose Software text chunk says kljax (a directory: `is_marked`)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return is_marked(path)
    try:
        head = path.read_bytes()[:4096] if path.suffix.lower() == ".png" else path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    if isinstance(head, bytes):
        return b"tEXtSoftware\x00kljax" in head
    try:
        data = json.loads(head)
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and str(data.get(WRITTEN_BY, "")).startswith("kljax")


def check_output(path: str | os.PathLike, what: str, *, overwrite: bool = False, directory: bool = False,
                 reads: Iterable[str | os.PathLike] = (), legacy: Iterable[str] = (),
                 read_what: str = "the run") -> Path:
    """The one rule of every writer (eval --json, plot-run --out, convert --out, export --out,
    save_pretrained): `path` (named `what` in errors) is not empty, is apart from every run in `reads`
    (`check_apart`), and replaces nothing kljax did not write unless `overwrite`; a directory kljax
    did not write is never replaced (a user's directory is not deleted on a flag). Returns the path."""
    if not str(path).strip():
        raise UserError(f"{what} '' is empty; give a {'directory' if directory else 'file'} path")
    path = Path(path)
    for run in reads:
        check_apart(path, run, what, read_what)
    if directory:
        if path.exists() and not path.is_dir():
            raise UserError(f"{what} {path} is a file; give a directory")
        if path.is_dir() and any(path.iterdir()):
            if not is_marked(path, legacy):
                raise UserError(f"{what} {path} is not empty and kljax did not write it (no {MARKER}): it is "
                                "not replaced, --overwrite or not; give a new or empty directory")
            if not overwrite:
                raise UserError(f"{what} {path} holds an earlier kljax output; pass --overwrite to replace it")
        return path
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give a file path")
    if path.exists() and not overwrite and not written_by_kljax(path):
        raise UserError(f"{what} {path} exists and kljax did not write it; pass --overwrite to replace it")
    return path
