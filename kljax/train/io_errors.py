"""Faults of the disk a command writes to (read-only, full, no permission) as one line naming the path.

`kljax.cli.main` turns any exception whose chain holds such a fault into `kljax CMD: error: cannot
write PATH: the file system is read-only (errno 30, EROFS); ...` instead of a traceback; orbax and
tensorstore report the same faults as ValueError text ("Failed to write ... No space left on device
[os_error_code='28']"), recognized here too. `quiet_orbax_threads()` keeps orbax's writer threads
from logging their own tracebacks of a fault that the main thread reports anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REASONS: dict[int, tuple[str, str]] = {  # errno -> (what it means, what to do)
    errno.EROFS: ("the file system is read-only", "give a writable location"),
    errno.ENOSPC: ("no space is left on the device", "free space there or give another location"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space there or give another location"),
    errno.EFBIG: ("the file is too large for the file system", "give another location"),
    errno.EACCES: ("permission denied", "give a location you may write to"),
    errno.EPERM: ("the operation is not permitted", "give a location you may write to"),
}
# tensorstore's text for an OS error (orbax raises it as a ValueError), and the file it names
_TS_CODE = re.compile(r"os_error_code='(\d+)'")
_TS_FILE = re.compile(r'(?:local file|Failed writing:?|writing) "([^"]+)"')
_TEXT = {"No space left on device": errno.ENOSPC, "Read-only file system": errno.EROFS,
         "Disk quota exceeded": errno.EDQUOT, "Permission denied": errno.EACCES}


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen and len(seen) < 16:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _from_text(text: str) -> tuple[int, str | None] | None:
    match = _TS_CODE.search(text)
    code = int(match.group(1)) if match else next((c for t, c in _TEXT.items() if t in text), None)
    if code not in REASONS:
        return None
    file = _TS_FILE.search(text)
    return code, file.group(1) if file else None


def disk_fault(error: BaseException) -> tuple[int, str | None] | None:
    """(errno, path or None) of the first write fault (read-only, full, quota, permission) in the
    exception chain of `error`, else None."""
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno in REASONS:
            return e.errno, e.filename if isinstance(e.filename, str) else None
        if isinstance(e, (ValueError, RuntimeError)):  # orbax / tensorstore wrap the OS error in text
            found = _from_text(str(e))
            if found:
                return found
    return None


def disk_fault_message(error: BaseException, what: str | None = None) -> str | None:
    """One line for a write fault in `error`'s chain (None if it holds none): `what` was written
    (default: the path the fault names), what the errno means and what to do."""
    found = disk_fault(error)
    if found is None:
        return None
    code, path = found
    reason, todo = REASONS[code]
    where = what or path or "a file"
    return f"cannot write {where}: {reason} (errno {code}, {errno.errorcode.get(code, '?')}); {todo}"


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


def check_writable(path: str | os.PathLike, what: str) -> None:
    """UserError when `path` could not be written: its nearest existing directory is on a read-only
    file system or not writable (checked with access(2), which reports EROFS even for root)."""
    from kljax.errors import UserError

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
