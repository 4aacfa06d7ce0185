"""User errors: bad values, paths, files, checkpoints or data that the user can fix.

`kljax.cli.main` prints any of `USER_ERRORS` as one line `kljax COMMAND: error: MESSAGE` and exits
2 (with `--debug`, it re-raises for the traceback). Anything else is a bug and keeps its traceback.
`UserError` is a ValueError, so code that catches ValueError still catches it.
"""

from __future__ import annotations

import json

USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError,
)


class UserError(ValueError):
    """A bad input named in the message, with the valid choices where there are some."""


def one_line(error: BaseException) -> str:
    """The message of `error` on one line (its type name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


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
