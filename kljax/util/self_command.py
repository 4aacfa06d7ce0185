"""The command line that starts `kljax ARGS` again in a new interpreter, without the working directory
on `sys.path`.

`python -m kljax` puts the working directory first on `sys.path` (and `python -c` puts '' there), so
a `json.py` where the user stands would be imported instead of the standard library's. `python -P`
(3.11+) fixes that but Python 3.10 has no -P; so the child runs a few lines with `-c` that drop the
'' entry before anything is imported (the interpreter's own start-up, `site` and .pth files, runs
before it is added), append the directory that holds this `kljax` package (so a source checkout
still finds it, after everything else), and call `kljax.cli.main`. PYTHONPATH is kept: it is the
user's explicit choice.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
_BOOT = (
    "import sys\n"
    "if sys.path[:1] == ['']:\n"
    "    del sys.path[0]  # the working directory: never import from it\n"
    "sys.path.append({root!r})\n"
    "from kljax.cli import main\n"
    "sys.exit(main())\n"
)


def kljax_argv(args: Sequence[str], executable: str | None = None) -> list[str]:
    """argv for `kljax ARGS` in a fresh interpreter (`executable`, default this one) that never
    imports from the working directory."""
    return [executable or sys.executable, "-c", _BOOT.format(root=PACKAGE_PARENT), *args]
