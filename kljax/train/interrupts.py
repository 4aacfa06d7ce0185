"""Ctrl-C that always stops a run: SIGINT is counted as well as raised.

Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be. When
that is inside a garbage-collector callback (JAX registers one, `_xla_gc_callback`) or a `__del__`,
Python prints "Exception ignored in ..." and goes on: a Ctrl-C during a run's start-up was lost
that way (3 runs in 8 here finished with exit status 0). Under `sticky_sigint()` the handler also
counts the signal; when it arrives inside a gc callback or `__del__` the handler raises nothing there
and interrupts the main thread again a moment later; `check()` at the trainer's safe points (every
step) raises KeyboardInterrupt while one is pending, and `sticky_sigint` raises it on exit if
nothing did.
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

_pending = 0
_installed = False


def _swallowing(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside a gc callback or a __del__, where Python would print and drop an exception."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _handler(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending += 1
    if _swallowing(frame):  # raise it a moment later, outside: no "Exception ignored" traceback, no loss
        threading.Timer(0.05, lambda: _installed and _pending and _thread.interrupt_main()).start()
        return
    raise KeyboardInterrupt


def pending() -> bool:
    """Whether a SIGINT arrived under `sticky_sigint` (and was not yet reported)."""
    return _pending > 0


def check() -> None:
    """Raise KeyboardInterrupt when a SIGINT arrived (its first KeyboardInterrupt may have been lost)."""
    if _pending:
        raise KeyboardInterrupt("interrupted (SIGINT)")


def reported() -> None:
    """The pending Ctrl-C was reported (and ends the command): nothing more to raise for it."""
    global _pending
    _pending = 0


@contextlib.contextmanager
def sticky_sigint() -> Iterator[None]:
    """Count SIGINT while the block runs and raise KeyboardInterrupt at its end when one arrived and
    nothing raised it. Nested uses are no-ops; outside the main thread, or when the SIGINT handler
    is not Python's default one (ignored, or the user's), nothing changes."""
    global _installed, _pending
    if (_installed or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _installed, _pending = True, 0
    signal.signal(signal.SIGINT, _handler)
    try:
        yield
        check()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _installed, _pending = False, 0


def stopped_message(workdir: str | os.PathLike) -> str:
    """What a run stopped by Ctrl-C keeps: its newest checkpoint step, and how to continue."""
    ckpt = Path(workdir) / "checkpoints"
    steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []
    if not steps:
        return f"interrupted (Ctrl-C) before the first checkpoint of {workdir}"
    return (f"interrupted (Ctrl-C); {workdir} keeps its checkpoint at step {steps[-1]}: "
            "`kljax train --resume` continues from it")
