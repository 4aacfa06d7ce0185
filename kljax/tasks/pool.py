"""A small process pool for reward checks that may hang or crash (math-verify on model output).

`VerifierPool.map(fn, args_list, timeout_s)` runs `fn(*args)` for each item on one of `num_workers` worker
processes and returns one `Outcome` per item, in order. Each item has its own time limit, counted from when
it is handed to a worker. A worker that overruns it is killed; a worker that dies (a crash, `os._exit`, a
segfault) is noticed through its pipe; either way that item's outcome is an error, a fresh worker replaces
the old one, and the other items go on unaffected (`concurrent.futures.ProcessPoolExecutor` cannot kill a
hung task, and one dead worker breaks its whole pool).
`fn` and its arguments are pickled here (a failure is that item's error): `fn` must be a module-level
function or a bound method of a picklable object whose class a fresh interpreter can import
(`kljax.tasks.reward_functions.RewardRef` carries other callables by value). Workers: `_Worker`.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import importlib
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_PRELOAD = ("kljax.tasks.rewards", "math_verify")
_SYS_PATH_ENV = "KLJAX_VERIFIER_SYS_PATH"
_BOOT = (  # run with -I: the working directory is not on sys.path until the caller's path replaces it
    "import json, os, sys; sys.path[:] = json.loads(os.environ.pop('KLJAX_VERIFIER_SYS_PATH', '[]')) or sys.path; "
    "from kljax.tasks.pool import _worker_entry; _worker_entry()"
)
NOT_RUN = "not run (an earlier item failed)"
OUT_OF_BUDGET = "timed out: not finished within the call's time budget"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result of one item: `value` when `error` is None, else why it failed."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _worker_entry() -> None:
    """A worker's `main`: `python -c _BOOT JOB_FD RESULT_FD PRELOAD...`."""
    jobs = Connection(int(sys.argv[1]), writable=False)
    results = Connection(int(sys.argv[2]), readable=False)
    _worker_main(jobs, results, sys.argv[3:])


def _worker_main(jobs: Connection, results: Connection, preload: Sequence[str]) -> None:
    """Worker loop: import `preload`, say ready, then run (job_id, fn, args) jobs until told to stop."""
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a missing optional module only slows the first job
            pass
    try:
        results.send(("ready", True, None))
    except OSError:  # the pool went away while this worker started (e.g. the run stopped): leave quietly
        return
    while True:
        try:
            message = jobs.recv()
        except (EOFError, OSError):  # the pool is gone
            return
        if message is None:
            return
        job_id, payload = message
        try:
            fn, args = pickle.loads(payload)  # here, not in recv: an unpicklable job is that job's error
            reply = (job_id, True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - report everything, the pool decides
            reply = (job_id, False, f"{type(exc).__name__}: {exc}"[:500])
        try:
            results.send(reply)
        except (BrokenPipeError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            results.send((job_id, False, f"could not send the result back: {type(exc).__name__}: {exc}"[:500]))


class _Worker:
    """One worker process, its job pipe (`jobs`, written here) and its result pipe (`conn`, read here).

    A fresh, isolated interpreter (`sys.executable -I`: no working directory on its path, no PYTHON*
    variables, so a `json.py` where the user stands is never executed) given the caller's `sys.path`
    explicitly, talking over two pipes with `multiprocessing.connection` framing. Unlike a multiprocessing
    "fork" worker it never inherits a multi-threaded JAX process (which can deadlock), and unlike a "spawn"
    worker it never re-imports the caller's `__main__` (no `if __name__ == "__main__":` guard needed). It
    imports the `preload` modules before it reports ready, so a slow import (math-verify's) never counts
    against an item's time limit."""

    def __init__(self, preload: Sequence[str]):
        job_read, job_write = os.pipe()
        result_read, result_write = os.pipe()
        env = {**os.environ, _SYS_PATH_ENV: json.dumps([p for p in sys.path if p])}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, str(job_read), str(result_write), *preload],
                pass_fds=(job_read, result_write),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            for fd in (job_read, job_write, result_read, result_write):
                os.close(fd)
            raise
        os.close(job_read)
        os.close(result_write)
        self.jobs = Connection(job_write, readable=False)
        self.conn = Connection(result_read, writable=False)
        self.started_at = time.monotonic()
        self.ready = False
        self.job: int | None = None
        self.deadline = 0.0
        self.limit_s = 0.0

    def kill(self) -> None:
        for conn in (self.jobs, self.conn):
            try:
                conn.close()
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class VerifierPool:
    """Worker processes that run picklable callables with a per-item time limit (see module docstring).

    Args:
      num_workers: worker processes (default: min(4, CPU count)).
      timeout_s: default per-item time limit in seconds.
      preload: modules each worker imports before it takes jobs.
      startup_timeout_s: how long a new worker may take to import `preload` and report ready.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        startup_timeout_s: float = 120.0,
    ):
        self.num_workers = num_workers or min(4, os.cpu_count() or 1)
        if self.num_workers < 1 or timeout_s <= 0:
            raise ValueError(f"need num_workers >= 1 and timeout_s > 0, got {num_workers}, {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.preload = tuple(preload)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.restarts = 0  # workers replaced after a timeout or a crash, over the pool's life
        self.closed = False

    def _spawn(self) -> _Worker:
        return _Worker(self.preload)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._spawn()
        self.restarts += 1

    def map(
        self, fn: Callable[..., Any], args_list: Sequence[tuple[Any, ...]], timeout_s: float | None = None,
        stop_on_error: bool = False, budget_s: float | None = None,
    ) -> list[Outcome]:
        """Run `fn(*args)` for every `args` of `args_list` on the workers; one Outcome per item, in order.
        With `stop_on_error`, return once an item fails: busy workers are replaced, unsent items get
        the error `NOT_RUN`. With `budget_s`, the whole call ends by then: items still running or
        unsent get an error saying so."""
        if self.closed:
            raise RuntimeError("this VerifierPool is closed")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            while len(self._workers) < self.num_workers:
                self._workers.append(self._spawn())
            try:
                end = None if budget_s is None else time.monotonic() + float(budget_s)
                return self._map_locked(fn, args_list, timeout, stop_on_error, end)
            except BaseException:  # e.g. KeyboardInterrupt: drop busy workers so no stale job outlives this call
                for worker in list(self._workers):
                    if worker.job is not None or not worker.ready:
                        worker.kill()
                        self._workers.remove(worker)
                raise

    def _map_locked(
        self, fn: Callable[..., Any], args_list: Sequence[tuple[Any, ...]], timeout: float, stop_on_error: bool,
        end: float | None = None,
    ) -> list[Outcome]:
        results: list[Outcome | None] = [None] * len(args_list)
        pending = collections.deque(range(len(args_list)))
        while pending or any(w.job is not None for w in self._workers):
            stopped = stop_on_error and any(r is not None and not r.ok for r in results)
            over = end is not None and time.monotonic() > end
            if stopped or over:
                why = OUT_OF_BUDGET if over else NOT_RUN
                for worker in list(self._workers):
                    if worker.job is not None:  # its item's outcome is not needed (or too late): do not wait
                        if over:
                            results[worker.job] = Outcome(error=why)
                        self._replace(worker)
                return [r if r is not None else Outcome(error=why) for r in results]
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.ready and worker.job is None and pending:
                    job = pending.popleft()
                    try:
                        payload = pickle.dumps((fn, args_list[job]))
                    except Exception as exc:  # noqa: BLE001 - e.g. a function or arguments that do not pickle
                        results[job] = Outcome(error=f"could not send the job: {type(exc).__name__}: {exc}")
                        continue
                    try:
                        worker.jobs.send((job, payload))
                    except (OSError, EOFError, ValueError):  # died while idle: retry the job elsewhere
                        pending.appendleft(job)
                        self._replace(worker)
                        continue
                    worker.job, worker.deadline, worker.limit_s = job, now + timeout, timeout
            self._wait_once(results)
        return [r if r is not None else Outcome(error="lost") for r in results]

    def _wait_once(self, results: list[Outcome | None]) -> None:
        """Wait for one round of replies, then deal with timed-out and crashed workers."""
        now = time.monotonic()
        deadlines = [w.deadline if w.ready else w.started_at + self.startup_timeout_s for w in self._workers]
        watched = [w for w in self._workers if not w.ready or w.job is not None]
        if not watched:
            return
        wait_s = max(0.0, min(d for w, d in zip(self._workers, deadlines, strict=True) if w in watched) - now)
        ready = wait([w.conn for w in watched], timeout=min(wait_s, 1.0))
        for worker in watched:
            if worker.conn not in ready:
                continue
            try:
                job_id, ok, value = worker.conn.recv()
            except (EOFError, OSError):
                self._fail(worker, results, "the worker process crashed")
                continue
            if job_id == "ready":
                worker.ready = True
                continue
            results[job_id] = Outcome(value=value) if ok else Outcome(error=str(value))
            worker.job = None
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.job is not None and now > worker.deadline:
                self._fail(worker, results, f"timed out after {worker.limit_s:g}s")
            elif not worker.ready and now > worker.started_at + self.startup_timeout_s:
                raise RuntimeError(
                    f"a verifier worker did not start within {self.startup_timeout_s:.0f}s "
                    f"(importing {list(self.preload)})"
                )

    def _fail(self, worker: _Worker, results: list[Outcome | None], why: str) -> None:
        if worker.job is not None:
            results[worker.job] = Outcome(error=why)
        elif not worker.ready:
            raise RuntimeError(f"a verifier worker died while starting (exit code {worker.process.poll()})")
        self._replace(worker)

    def close(self) -> None:
        """Stop all workers."""
        with self._lock:
            for worker in self._workers:
                try:
                    worker.jobs.send(None)
                    worker.process.wait(timeout=2)
                except (OSError, EOFError, ValueError, subprocess.TimeoutExpired):
                    pass
                worker.kill()
            self._workers = []
            self.closed = True

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default_pool: VerifierPool | None = None
_default_lock = threading.Lock()


def default_pool() -> VerifierPool:
    """The process-wide pool used by `score_batch` when none is given (started on first use)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool.closed:
            _default_pool = VerifierPool()
            atexit.register(_default_pool.close)
        return _default_pool
