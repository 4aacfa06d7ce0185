"""Quiet echoes of a failed checkpoint write: orbax's writer threads and tensorstore's callbacks log
their own tracebacks of a full or read-only disk that the main thread reports once, as one line.

    with quiet_orbax_threads():            # while saving
        manager.save(...)
    drop_abandoned_write_callbacks()       # after a failed save: writes still in flight end quietly
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from kljax.errors import disk_fault


class _DropThreadTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and "raised an exception" in str(record.msg))


def _echo_of_a_failed_write(error: BaseException | None) -> bool:
    """Whether `error` is what the writes of a failed save raise in their own threads and tasks: the
    disk fault itself (reported once by the main thread) or asyncio's "Event loop is closed" (a write
    abandoned by the failure, finishing after orbax's event loop closed)."""
    if error is None:
        return False
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    return disk_fault(error) is not None


class _DropWriteEchoes(logging.Filter):
    """Records of concurrent.futures ("exception calling callback"), asyncio ("Task exception was
    never retrieved") and absl (orbax's "_SignalingThread.run() raised an exception", logged by a
    writer thread that ends after the save was reported) whose exception echoes a failed write
    (`_echo_of_a_failed_write`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _echo_of_a_failed_write(record.exc_info[1] if record.exc_info else None)


_ECHO_FILTER = _DropWriteEchoes()
_ECHO_LOGGERS = ("concurrent.futures", "asyncio", "absl")
_threading_excepthook = threading.excepthook  # the hook ours delegates to (the one it replaced)
_call_soon_threadsafe = asyncio.BaseEventLoop.call_soon_threadsafe
_after_a_failed_save = False  # then the echoes stay quiet for good


def _quiet_thread_echoes(args: Any) -> None:
    """threading.excepthook that prints nothing for a thread (orbax's writers) dying of a failed write."""
    if not _echo_of_a_failed_write(args.exc_value):
        _threading_excepthook(args)


def _unless_closed(loop: asyncio.BaseEventLoop, callback: Any, *args: Any, context: Any = None) -> Any:
    """call_soon_threadsafe that does nothing on a closed loop (nothing could ever run the callback)
    instead of raising "Event loop is closed" into tensorstore's C++ thread, which prints it."""
    if loop.is_closed():
        return None
    return _call_soon_threadsafe(loop, callback, *args, context=context)


def _quiet_write_echoes(on: bool) -> None:
    """The echoes of a failed write print nothing (on) or as before (off, unless a save has failed):
    the loggers' records, threads dying of it, tensorstore's calls into a closed loop. Idempotent."""
    global _threading_excepthook
    quiet = on or _after_a_failed_save
    for name in _ECHO_LOGGERS:  # addFilter and removeFilter are idempotent
        if quiet:
            logging.getLogger(name).addFilter(_ECHO_FILTER)
        else:
            logging.getLogger(name).removeFilter(_ECHO_FILTER)
    asyncio.BaseEventLoop.call_soon_threadsafe = (  # type: ignore[method-assign]
        _unless_closed if quiet else _call_soon_threadsafe)
    if quiet and threading.excepthook is not _quiet_thread_echoes:
        _threading_excepthook, threading.excepthook = threading.excepthook, _quiet_thread_echoes
    elif not quiet and threading.excepthook is _quiet_thread_echoes:
        threading.excepthook = _threading_excepthook


def drop_abandoned_write_callbacks() -> None:
    """From now on, writes that a failed checkpoint save abandoned print nothing when they end (after
    orbax's event loop closed, or of the same fault); other errors are still printed."""
    global _after_a_failed_save
    _after_a_failed_save = True
    _quiet_write_echoes(True)


@contextlib.contextmanager
def quiet_orbax_threads() -> Iterator[None]:
    """While active, orbax's writer threads do not log tracebacks of the exceptions they raise
    (`_SignalingThread.run() raised an exception`), nor echo a failed write: the caller gets the
    exception and reports it."""
    logger = logging.getLogger("absl")
    dropper = _DropThreadTracebacks()
    logger.addFilter(dropper)
    _quiet_write_echoes(True)
    try:
        yield
    finally:
        logger.removeFilter(dropper)
        _quiet_write_echoes(False)  # kept after a failed save (drop_abandoned_write_callbacks)
