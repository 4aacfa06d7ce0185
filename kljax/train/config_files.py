"""Importing an ml_collections config file (`configs/NAME.py` with `get_config()`), its failures
as UserErrors naming the file: missing, a syntax error (with the line), no get_config(), or an
exception raised while building the config."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from kljax.errors import UserError


def get_config_of(path: str | os.PathLike, hint: str = "") -> Any:
    """`get_config()` of the Python file at `path`; its directory is on sys.path meanwhile, so a
    config can import a shared base beside it. `hint` is added to the message of a missing file."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a config file" if path.is_dir() else "does not exist"
        raise UserError(f"config file {str(path)!r} {what}{hint}")
    spec = importlib.util.spec_from_file_location(f"kljax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise UserError(f"config file {str(path)!r} has no get_config()")
        return module.get_config()
    except SyntaxError as e:
        raise UserError(f"config file {str(path)!r} has a syntax error at line {e.lineno}: {e.msg}") from e
    except UserError:
        raise
    except Exception as e:  # the user's code: report it as the file's error, not kljax's
        raise UserError(f"config file {str(path)!r} failed to load: {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
