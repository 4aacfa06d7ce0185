"""The one-line error a failing `kljax COMMAND` prints, as the tests of faults check it."""

from __future__ import annotations


def the_error_line(stderr: str, command: str) -> str:
    """The one `kljax COMMAND: error: ...` line of `stderr`; asserts it is the only error line and that
    no traceback was printed."""
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(f"kljax {command}: error: "), stderr[-3000:]
    return errors[0]
