"""Faults of the disk a command writes to (read-only, full, no permission) as one line naming the path.

The command line and the API turn any exception whose chain holds such a fault (`kljax.errors.disk_fault`,
which also reads orbax's and tensorstore's text of them) into `cannot write PATH: the file system is
read-only (errno 30, EROFS); give a writable location` instead of a traceback. An exception in the
chain with a `what` attribute (a failed checkpoint save) names what was being written.
"""

from __future__ import annotations

import errno

from kljax.errors import REASONS, chain, disk_fault


def disk_fault_message(error: BaseException, what: str | None = None) -> str | None:
    """One line for a write fault in `error`'s chain (None if it holds none): `what` was written
    (default: the path the fault names), what the errno means and what to do."""
    found = disk_fault(error)
    if found is None:
        return None
    code, path = found
    reason, todo = REASONS[code]
    named = next((e.what for e in chain(error) if getattr(e, "what", None)), None)
    where = what or named or path or "a file"
    return f"cannot write {where}: {reason} (errno {code}, {errno.errorcode.get(code, '?')}); {todo}"
