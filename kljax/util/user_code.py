"""Running a user's code (a config file's get_config, a reward function) without letting it end the
process: `os._exit` raises `ExitCalled` instead, which the caller reports as one line."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class ExitCalled(BaseException):  # noqa: N818 - not an error of ours: the code asked to exit
    """Raised by the patched `os._exit` in place of ending the process (a BaseException, so the
    user's own `except Exception` does not swallow it)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Exited:
    """What `refuse_exit` saw: `code` is the status the code passed to os._exit, or None."""

    code: int | None = None


@contextlib.contextmanager
def refuse_exit() -> Iterator[Exited]:
    """While active, `os._exit(n)` raises ExitCalled; the block ends there and `code` holds n."""
    seen = Exited()
    real_exit = os._exit

    def refuse(code: int = 0) -> None:
        raise ExitCalled(code)

    os._exit = refuse
    try:
        yield seen
    except ExitCalled as e:
        seen.code = e.code
    finally:
        os._exit = real_exit
