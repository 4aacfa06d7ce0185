"""One run per workdir: WORKDIR/run.lock holds the owner's pid, host and process start time.

`WorkdirLock(workdir).acquire()` writes the file under an exclusive flock of WORKDIR; when it exists and its
owner is alive (same host, same pid and start time), it is a UserError naming the owner. A lock of a dead
process on this host (killed, crashed) is stale and taken over. A lock from another host cannot be
checked from here and is refused; delete the file by hand when that host's run is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from kljax.errors import UserError

LOCK_NAME = "run.lock"


def _start_time(pid: int) -> str | None:
    """The start time of `pid` from /proc (None when it is not running or /proc is absent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(owner: dict) -> bool:
    pid = int(owner.get("pid", -1))
    if pid <= 0:
        return False
    start = _start_time(pid)
    if start is not None:
        return owner.get("start") in (None, start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path("/proc").is_dir()


@contextlib.contextmanager
def _guard(directory: Path) -> Iterator[None]:
    """An exclusive flock of `directory` (released when the block ends or the process dies)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


class WorkdirLock:
    """The lock of `workdir`; `acquire` then `release` (or use it as a context manager)."""

    def __init__(self, workdir: str | os.PathLike) -> None:
        self.path = Path(workdir) / LOCK_NAME
        self.held = False

    def _mine(self) -> dict:
        pid = os.getpid()
        return {"pid": pid, "host": socket.gethostname(), "start": _start_time(pid), "since": time.time()}

    def _owner(self) -> dict | None:
        """The recorded owner (None: no lock file; {} when it is unreadable, e.g. cut short)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError:
            return {}
        try:
            owner = json.loads(text or "{}")
        except ValueError:
            return {}
        return owner if isinstance(owner, dict) else {}

    def acquire(self) -> WorkdirLock:
        """Take the lock, or raise UserError when another live run holds it.

        Every decision (free, stale, held) and the write that follows it happen under an exclusive
        `flock` of the workdir itself, and the lock file is replaced whole (temp file + rename):
        processes that find the same dead owner's lock at once take it over one at a time, so one
        holds it and the others see that holder alive."""
        mine = self._mine()
        with _guard(self.path.parent):
            owner = self._owner()
            if owner is not None and owner.get("host") not in (None, mine["host"]):
                raise UserError(
                    f"{self.path.parent} is locked by a run on host {owner['host']} (pid {owner.get('pid')}); "
                    f"wait for it, or delete {self.path} if that run is gone"
                )
            if owner and _alive(owner):
                raise UserError(
                    f"{self.path.parent} is in use by another run (pid {owner.get('pid')} on {owner.get('host')}); "
                    "wait for it to finish or use another --workdir"
                )
            tmp = self.path.with_name(f".{LOCK_NAME}.{mine['pid']}.tmp")
            tmp.write_text(json.dumps(mine))
            os.replace(tmp, self.path)  # free, or stale (its process is gone): ours now
        self.held = True
        return self

    def release(self) -> None:
        """Remove the lock file if this process holds it (and it still names this process)."""
        if self.held:
            self.held = False
            with _guard(self.path.parent):
                owner = self._owner() or {}
                if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
                    self.path.unlink(missing_ok=True)

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
