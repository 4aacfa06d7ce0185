"""Faults of a reward function run in this process that would end or break the run without a word.

    with in_process_guard() as guard:
        value = fn(**kwargs)
    guard.problem   # None, or what the function did, in a few words

While the guard is active:
- `os._exit(n)` raises `ExitCalled` instead (a BaseException, so the function's own `except Exception` does
  not swallow it); `problem` says "called os._exit(n)";
- a thread the function starts is a daemon, and a child it forks ends when the function returns in it;
- the standard streams survive the function closing them, and a descriptor the process holds for good that
  the function closed is named in `problem`, after which the run stops (`Guard`);
- a fatal error in its native code (a segmentation fault, an abort) is reported in one line naming the
  function (`_crash_report_fd`) instead of nothing (rc 139). The run cannot survive it; reward.timeout_s runs
  functions in worker processes, where a crash is one error for that function.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import os
import resource
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from kljax.util.user_code import ExitCalled

_FD_DIR = Path("/proc/self/fd")


class Guard:
    """`problem`: None, or what the guarded call did ("called os._exit(3)", "closed file descriptors [2, 7]").

    The standard streams (fds 0-2) are duplicated first, to numbers just under the RLIMIT_NOFILE limit (out
    of reach of a `closerange(0, 4096)` where the limit is higher); one the function closed is restored after
    it, so the run can still print its error. Held for good: a standard stream, or a descriptor open both
    after the previous guarded call and before this one (a file another thread opens and closes meanwhile is
    not the function's doing); at the first call, every one open. Read from /proc/self/fd (Linux); elsewhere
    only the standard streams are checked. After descriptors were closed the run stops: other threads' and
    finalizers' errors of the closed files are not printed, so the line naming the function is what is read.
    """

    problem: str | None = None


_held_after_last_call: set[int] | None = None  # descriptors open when the previous guarded call ended


def _open_fds() -> set[int]:
    try:
        return {int(name) for name in os.listdir(_FD_DIR)}
    except OSError:
        return set()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _high_copy(fd: int, slot: int) -> int:
    """A close-on-exec copy of `fd` numbered just under the descriptor limit (or the lowest free one)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = max(soft - 8 + slot, 3) if 0 < soft < 1 << 20 else 3
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
    except OSError:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


_WATCHER = r"""
import re, sys
who, report = "a reward function", []
for line in sys.stdin.buffer:
    text = line.decode("utf-8", "replace")
    if text.startswith("\x1fcall "):
        who, report = text[6:].strip(), []
    else:
        report.append(text)
report = "".join(report)
if "Fatal Python error" in report:
    what = re.search(r"Fatal Python error: ([^\n]+)", report)
    frame = re.search(r'File "([^"]+)", line (\d+) in (\S+)', report)
    at = f" (at {frame[1]} line {frame[2]} in {frame[3]})" if frame else ""
    print(f"{sys.argv[1]}: error: the process died of a {what[1] if what else 'fatal error'} in {who}, run in "
          f"process{at}; with reward.timeout_s reward functions run in worker processes, where a crash is one "
          "error for that function", file=sys.stderr, flush=True)
"""
_watcher_fd: int | None = None  # the write end of the watcher's pipe, close-on-exec, numbered high


def _crash_report_fd() -> int | None:
    """The descriptor faulthandler writes to during guarded calls, or None: a pipe read by a watcher process
    started with the first call (`python -I`, importing only `re` and `sys`). When the process dies of a fatal
    error the watcher prints `kljax train: error: the process died of a Segmentation fault in reward function
    'f' (r.py:f), run in process (at FILE line N in FN); ...`."""
    global _watcher_fd
    if _watcher_fd is None:
        import subprocess

        command = "kljax train" if sys.argv[1:2] == ["train"] else "kljax"
        read_end, write_end = os.pipe()
        try:
            subprocess.Popen([sys.executable, "-I", "-c", _WATCHER, command], stdin=read_end,
                             stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.close(write_end)
            return None
        finally:
            os.close(read_end)
        _watcher_fd = _high_copy(write_end, 3)
        os.close(write_end)
    return _watcher_fd


def _quiet_after_fault() -> None:
    """The run stops after this: its threads' and finalizers' errors of the closed files say nothing new."""
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda unraisable: None


@contextlib.contextmanager
def in_process_guard(who: str = "a reward function", active: bool = True) -> Iterator[Guard]:
    """Guard one in-process reward call of `who` (see the module docstring; `active=False`: a no-op, for
    kljax's own functions); not thread-safe (one caller)."""
    global _held_after_last_call
    guard = Guard()
    if not active:
        yield guard
        return
    now = _open_fds()
    held = {fd for fd in (now if _held_after_last_call is None else now & _held_after_last_call) if _is_open(fd)}
    saved = {fd: _high_copy(fd, fd) for fd in (0, 1, 2) if _is_open(fd)}
    real_exit = os._exit
    had_faulthandler = faulthandler.is_enabled()

    def refuse_exit(code: int = 0) -> None:
        raise ExitCalled(code)

    os._exit = refuse_exit
    pid, real_start = os.getpid(), threading.Thread.start

    def daemon_start(thread: threading.Thread) -> None:  # a thread the function leaves cannot hold the exit
        if not thread.is_alive():
            thread.daemon = True
        real_start(thread)

    threading.Thread.start = daemon_start  # type: ignore[method-assign]
    real_hook, held_errors = threading.excepthook, []
    threading.excepthook = held_errors.append  # kljax's threads' errors during the call: said after it
    report_fd = None if had_faulthandler else _crash_report_fd()
    if report_fd is not None:
        try:
            os.write(report_fd, f"\x1fcall {' '.join(who.split())}\n".encode())
            faulthandler.enable(file=report_fd, all_threads=False)
        except OSError:  # the watcher is gone: no report, as without the guard
            report_fd = None
    try:
        yield guard
    except ExitCalled as e:
        guard.problem = f"called os._exit({e.code})"
    finally:
        os._exit = real_exit
        threading.Thread.start = real_start  # type: ignore[method-assign]
        if os.getpid() != pid:  # the function forked and this is the child: it must not run the loop too
            real_exit(0)
        if report_fd is not None:
            faulthandler.disable()
        closed = sorted(fd for fd in (held | set(saved)) - set(saved.values()) if not _is_open(fd))
        for fd, copy in saved.items():
            if fd in closed:
                os.dup2(copy, fd)
            os.close(copy)
        _held_after_last_call = {fd for fd in _open_fds() if _is_open(fd)}
        threading.excepthook = real_hook
        if closed:  # those errors came from the closed files: the run stops saying so, once
            _quiet_after_fault()
            guard.problem = guard.problem or f"closed file descriptors {closed} that kljax had open"
        for args in held_errors if not closed else ():
            real_hook(args)
