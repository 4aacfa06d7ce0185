"""The stale-lock takeover of `kljax.boundary.workdir_lock` is atomic: many processes that find the same
dead owner's run.lock at the same moment leave exactly one holder."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from kljax.boundary.workdir_lock import LOCK_NAME, WorkdirLock

WORKERS, TRIALS, GAP_S = 8, 40, 0.03
# Each worker takes part in every trial: at start + k * GAP_S it tries to take trial k's lock and,
# when it gets it, appends its pid to that trial's holders file (and keeps the lock: it is alive).
_WORKER = """
import os, sys, time
from pathlib import Path
from kljax.errors import UserError
from kljax.boundary.workdir_lock import WorkdirLock
root, start, trials, gap = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
held = []
for k in range(trials):
    time.sleep(max(0.0, start + k * gap - time.time()))
    try:
        held.append(WorkdirLock(root / str(k)).acquire())
    except UserError:
        continue
    with open(root / str(k) / "holders", "a") as f:
        f.write(f"{os.getpid()}\\n")
time.sleep(0.2)
"""


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_concurrent_takeover_of_a_dead_owners_lock_leaves_one_holder(tmp_path):
    stale = json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "start": "1", "since": 0.0})
    for k in range(TRIALS):
        (tmp_path / str(k)).mkdir()
        (tmp_path / str(k) / LOCK_NAME).write_text(stale)
    start = time.time() + 2.0  # every worker has imported by then
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path), str(start), str(TRIALS), str(GAP_S)])
             for _ in range(WORKERS)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    holders = {k: (tmp_path / str(k) / "holders").read_text().split() for k in range(TRIALS)}
    several = {k: h for k, h in holders.items() if len(h) != 1}
    assert not several, f"trials without exactly one holder: {several}"


def test_release_keeps_a_lock_that_names_another_process(tmp_path):
    lock = WorkdirLock(tmp_path).acquire()
    other = {"pid": _dead_pid(), "host": socket.gethostname()}
    (tmp_path / LOCK_NAME).write_text(json.dumps(other))  # e.g. taken over after this one was presumed dead
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == other
    assert not list(Path(tmp_path).glob(f".{LOCK_NAME}.*"))  # no temp files left
