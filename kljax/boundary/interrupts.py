"""Ctrl-C that always stops a run, once, with exit status 130: SIGINT is counted as well as raised.

Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be, which goes
wrong in three places:
- a garbage-collector callback (JAX registers one) or a `__del__`: Python prints "Exception ignored in ..."
  and goes on, and the Ctrl-C is lost (the run finishes with status 0);
- an import: raised while a C++ extension's initialiser runs Python (`import torch`), it aborts the process;
- a late re-delivery: a Ctrl-C re-raised after the first one was reported escapes the command's handler.
Under `sticky_sigint()` the handler counts the signal; inside a gc callback, a `__del__` or an import it
raises nothing and interrupts the main thread again `REDELIVER_S` later (until it is outside); `check()` at
the trainer's safe points raises KeyboardInterrupt while one is pending, and `sticky_sigint` raises it on
exit if nothing did. Once `reported()` says the Ctrl-C ends the command, further SIGINTs (a re-delivery, or
the user pressing again) are ignored until the block ends.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

REDELIVER_S = 0.05
_IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")

_lock = threading.Lock()  # orders the re-delivery thread against reported() and the block's end
_pending = 0
_installed = False
_reported = False


def _unsafe(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside a gc callback or a `__del__` (where Python prints and drops an
    exception) or an import (where a C++ module initialiser may abort on one)."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or code.co_filename in _IMPORT_FILES:
            return True
        frame = frame.f_back
    return False


def _redeliver() -> None:
    with _lock:
        if _installed and _pending and not _reported:
            _thread.interrupt_main()


def _handler(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _reported or not _installed:  # the command is already stopping for a Ctrl-C: nothing to add
        return
    _pending += 1
    if _unsafe(frame):  # raise it a moment later, outside: no lost Ctrl-C, no abort
        threading.Timer(REDELIVER_S, _redeliver).start()
        return
    raise KeyboardInterrupt


def pending() -> bool:
    """Whether a SIGINT arrived under `sticky_sigint` (and was not yet reported)."""
    return _pending > 0


def check() -> None:
    """Raise KeyboardInterrupt when a SIGINT arrived (its first KeyboardInterrupt may have been lost)."""
    if _pending and not _reported:
        raise KeyboardInterrupt("interrupted (SIGINT)")


def reported() -> None:
    """The pending Ctrl-C was reported and ends the command: nothing more is raised for it, nor for
    another SIGINT, until the `sticky_sigint` block ends."""
    global _pending, _reported
    with _lock:
        _pending, _reported = 0, True


@contextlib.contextmanager
def sticky_sigint() -> Iterator[None]:
    """Count SIGINT while the block runs and raise KeyboardInterrupt at its end when one arrived and
    nothing raised it. Nested uses are no-ops; outside the main thread, or when the SIGINT handler
    is not Python's default one (ignored, or the user's), nothing changes."""
    global _installed, _pending, _reported
    if (_installed or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _installed, _pending, _reported = True, 0, False
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
        check()
    finally:
        with _lock:  # no re-delivery starts after this
            _installed = False
        # signal.signal first runs the handler of a SIGINT already delivered (a re-delivery that
        # raced the block's end): `_handler` ignores it now, the default one would raise it later
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _pending, _reported = 0, False


def stopped_message(workdir: str | os.PathLike) -> str:
    """What a run stopped by Ctrl-C keeps: its newest checkpoint step, and how to continue."""
    ckpt = Path(workdir) / "checkpoints"
    steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []
    if not steps:
        return f"interrupted (Ctrl-C) before the first checkpoint of {workdir}"
    return (f"interrupted (Ctrl-C); {workdir} keeps its checkpoint at step {steps[-1]}: "
            "`kljax train --resume` continues from it")
