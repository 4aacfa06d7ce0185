"""The boundary around a command or a training run: what the command line and the Python API wrap
the core in, and the one policy that turns a fault a user meets into one line.

    code = run_command("train", fn, debug=False)   # CLI: fn() under Ctrl-C handling, errors as one line
    result = guarded_run(workdir, train_fn)         # API: the workdir lock, Ctrl-C, disk faults

A user error (`USER_ERRORS`: a bad value, path, file, checkpoint or data) or a fault of the disk
being written is one line `kljax COMMAND: error: MESSAGE` and exit status 2; Ctrl-C is one line
and 130; anything else is a bug and keeps its traceback (as does everything with --debug).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from kljax.boundary import interrupts
from kljax.boundary.disk_faults import disk_fault_message
from kljax.boundary.workdir_lock import WorkdirLock
from kljax.errors import UserError
from kljax.train.events import LoopControl, LoopObserver, LoopState

T = TypeVar("T")
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError,
)


def one_line(error: BaseException) -> str:
    """The message of `error` on one line (its type name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def user_message(error: BaseException) -> str | None:
    """The one line a user reads for `error`, or None when it is a bug (keep the traceback)."""
    if isinstance(error, UserError):
        return one_line(error)
    message = disk_fault_message(error)
    if message is None and isinstance(error, USER_ERRORS):
        message = one_line(error)
    return message


def run_command(command: str, fn: Callable[[], int | None], debug: bool = False) -> int:
    """fn()'s exit status; a user error prints one line `kljax COMMAND: error: MESSAGE` to stderr and
    returns 2 (Ctrl-C: one line, 130); with `debug` it is re-raised for its traceback."""
    try:
        with interrupts.sticky_sigint():  # a Ctrl-C is never lost
            code = int(fn() or 0)
            interrupts.check()  # one whose KeyboardInterrupt was lost is no success
            return code
    except KeyboardInterrupt as e:
        interrupts.reported()
        if debug:
            raise
        print(f"kljax {command}: error: {one_line(e) if str(e) else 'interrupted (Ctrl-C)'}", file=sys.stderr)
        return 130
    except Exception as e:
        message = user_message(e)
        if debug or message is None:
            raise
        print(f"kljax {command}: error: {message}", file=sys.stderr)
        return 2


class CtrlCCheck(LoopObserver):
    """Stops the loop at a step boundary when a Ctrl-C's KeyboardInterrupt was lost (in a gc callback)."""

    def on_step_begin(self, state: LoopState, control: LoopControl) -> None:
        interrupts.check()

    def on_step_end(self, state: LoopState, control: LoopControl) -> None:
        interrupts.check()


def guarded_run(workdir: str | Path, run: Callable[[Sequence[LoopObserver]], T], lock: bool = True) -> T:
    """run(observers) with WORKDIR locked (one run per workdir, `lock` on process 0), Ctrl-C always
    stopping it (a KeyboardInterrupt saying what the workdir keeps), and a disk fault raised as one
    UserError naming the run's files."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    held = WorkdirLock(workdir).acquire() if lock else None
    try:
        with interrupts.sticky_sigint():
            return run([CtrlCCheck()])
    except KeyboardInterrupt:
        raise KeyboardInterrupt(interrupts.stopped_message(workdir)) from None
    except OSError as e:  # a full or read-only disk: one line naming the workdir when the error names no file
        message = disk_fault_message(e, None if e.filename or getattr(e, "what", None) else
                                     f"the run's files in {workdir}")
        if message is None:
            raise
        raise UserError(message) from e
    finally:
        if held is not None:
            held.release()

