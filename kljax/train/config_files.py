"""Reading a config file: a Python file (`configs/NAME.py` with `get_config()`), or a YAML / JSON
file of fields over the run defaults (configs/kljax_base.py). Every failure is a UserError naming
the file: missing, a syntax error (with the line), no get_config(), an exception raised while
building the config, a YAML/JSON file that is not a mapping, unknown keys (all of them, in one line).

A YAML/JSON file holds the fields to change, nested as in the Python configs:

    steps: 50
    model: {source: tiny}
    rl: {temperature: 1.0, stop: ["\\n\\n"]}

or flat with dots (`rl.temperature: 1.0`). Values are checked afterwards by the same validation as
a Python config's (`kljax.train.config.validate`); a WORKDIR/config.json written by `kljax train`
is such a file, so `--config WORKDIR/config.json` reruns a run's settings.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from kljax.errors import UserError

DATA_SUFFIXES = (".yaml", ".yml", ".json")


def get_config_of(path: str | os.PathLike, hint: str = "",
                  defaults: Callable[[], ml_collections.ConfigDict | None] | None = None) -> Any:
    """The config of the file at `path`: `get_config()` of a Python file (its directory is on sys.path
    meanwhile, so a config can import a shared base beside it), or for a .yaml/.yml/.json file its
    fields over `defaults()` (None: only Python files are accepted). `hint` is added to the message
    of a missing file."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a config file" if path.is_dir() else "does not exist"
        raise UserError(f"config file {str(path)!r} {what}{hint}")
    if path.suffix.lower() in DATA_SUFFIXES:
        if defaults is None:
            raise UserError(f"config file {str(path)!r}: this command takes a Python config file with get_config()")
        base = defaults()
        if base is None:
            raise UserError(f"config file {str(path)!r}: YAML/JSON configs need configs/kljax_base.py "
                            "(the run defaults), found only in a source checkout of kljax")
        return config_from_mapping(read_mapping(path), base, str(path))
    if path.suffix.lower() != ".py":
        raise UserError(f"config file {str(path)!r} is not a .py, .yaml, .yml or .json file")
    return _python_config(path)


def _python_config(path: Path) -> Any:
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


def read_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML or JSON file (an empty file is {})."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"config file {str(path)!r} is not UTF-8 text: {e.reason} at byte {e.start}") from e
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise UserError(f"config file {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} "
                            f"column {e.colno}") from e
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or type(e).__name__
            raise UserError(f"config file {str(path)!r} is not valid YAML: {problem}{where}") from e
        data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping of config fields")
    return data


def _nested(data: Mapping[str, Any]) -> dict[str, Any]:
    """`{"rl.temperature": 1}` -> `{"rl": {"temperature": 1}}` (dotted keys at any level)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            value = _nested(value)
        head, *rest = str(key).split(".")
        for part in reversed(rest):
            value = {part: value}
        if isinstance(out.get(head), dict) and isinstance(value, dict):
            out[head] = _merge(out[head], value)
        else:
            out[head] = value
    return out


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _unknown_keys(data: Mapping[str, Any], base: Mapping[str, Any], prefix: str = "") -> list[tuple[str, list[str]]]:
    """(dotted key, the valid keys beside it) of every key of `data` that `base` lacks."""
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in base:
            out.append((name, sorted(base)))
        elif isinstance(base[key], Mapping) and isinstance(value, Mapping):
            out.extend(_unknown_keys(value, base[key], f"{name}."))
    return out


def config_from_mapping(data: Mapping[str, Any], base: ml_collections.ConfigDict,
                        source: str) -> ml_collections.ConfigDict:
    """`base` with the fields of `data` (nested or dotted keys) set over it; every key `base` lacks
    is named in one UserError with `source` (an int where the default is a float becomes a float;
    the types and ranges are `validate`'s to check)."""
    data = _nested(data)
    defaults = base.to_dict()
    unknown = _unknown_keys(data, defaults)
    if unknown:
        parts = []
        for name, valid in unknown:
            close = difflib.get_close_matches(name.rsplit(".", 1)[-1], valid, n=1)
            parts.append(f"{name}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        section = unknown[0][0].rsplit(".", 1)[0] if "." in unknown[0][0] else ""
        valid = unknown[0][1]
        raise UserError(f"config file {source!r} has unknown key(s): {', '.join(parts)}; valid"
                        f"{f' in {section}' if section else ' at the top level'}: {', '.join(valid)}")
    return ml_collections.ConfigDict(_merge_typed(defaults, data))


def _merge_typed(defaults: dict[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for key, value in data.items():
        old = defaults.get(key)
        if isinstance(old, dict) and isinstance(value, Mapping):
            out[key] = _merge_typed(old, value)
        elif isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
            out[key] = float(value)
        else:
            out[key] = value
    return out
