"""The errors kljax raises about a user's input, and the recognition of a disk fault in an error.

`UserError` is a bad value, path, file, checkpoint or data that the user can fix, named in the
message; it is a ValueError. The boundary (`kljax.boundary.run`) prints such errors as one line.
`disk_fault` finds a read-only, full or forbidden disk in an exception's chain (orbax's text too).
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Iterator


class UserError(ValueError):
    """A bad input named in the message, with the valid choices where there are some."""


def read_json(path: object, what: str = "file") -> object:
    """json.load of `path`, a UserError naming the file and the position when it is not JSON."""
    from pathlib import Path

    path = Path(path)  # type: ignore[arg-type]
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not text (JSON): {e.reason} at byte {e.start}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from e


# ------------------------------------------------------------------------ faults of the disk written to

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


def chain(error: BaseException) -> Iterator[BaseException]:
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
    for e in chain(error):
        if isinstance(e, OSError) and e.errno in REASONS:
            return e.errno, e.filename if isinstance(e.filename, str) else None
        if isinstance(e, (ValueError, RuntimeError)):  # orbax / tensorstore wrap the OS error in text
            found = _from_text(str(e))
            if found:
                return found
    return None
