"""One run per workdir: WORKDIR/run.lock holds the owner's pid, host and process start time.

`WorkdirLock(workdir).acquire()` creates the file exclusively; when it exists and its owner is
alive (same host, same pid and start time), it is a UserError naming the owner. A lock of a dead
process on this host (killed, crashed) is stale and taken over. A lock from another host cannot be
checked from here and is refused; delete the file by hand when that host's run is gone.
"""

from __future__ import annotations

import json
import os
import socket
import time
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


class WorkdirLock:
    """The lock of `workdir`; `acquire` then `release` (or use it as a context manager)."""

    def __init__(self, workdir: str | os.PathLike) -> None:
        self.path = Path(workdir) / LOCK_NAME
        self.held = False

    def _mine(self) -> dict:
        pid = os.getpid()
        return {"pid": pid, "host": socket.gethostname(), "start": _start_time(pid), "since": time.time()}

    def acquire(self) -> WorkdirLock:
        """Take the lock, or raise UserError when another live run holds it."""
        mine = self._mine()
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    owner = json.loads(self.path.read_text() or "{}")
                except (OSError, ValueError):
                    owner = {}
                if owner.get("host") not in (None, mine["host"]):
                    raise UserError(
                        f"{self.path.parent} is locked by a run on host {owner['host']} (pid {owner.get('pid')}); "
                        f"wait for it, or delete {self.path} if that run is gone"
                    ) from None
                if owner and _alive(owner):
                    raise UserError(
                        f"{self.path.parent} is in use by another run (pid {owner.get('pid')} on {owner.get('host')}); "
                        "wait for it to finish or use another --workdir"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(mine, f)
            self.held = True
            return self
        raise UserError(f"could not take {self.path}: other runs keep creating it")

    def release(self) -> None:
        """Remove the lock file if this process holds it."""
        if self.held:
            self.held = False
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
