"""Building a `RunConfig` at the edge, from whatever the user hands in.

    config = load_run_config("run.yaml", overrides=["--config.steps=3"])   # a file, then overrides
    config = load_run_config({"steps": 50, "kl": {"beta": 0.1}})          # a dict of fields
    config = with_fields(config, {"rl.group_size": 8})                     # more fields over a config

Every form is fields over the defaults of `RunConfig` (the default run): a dict (nested, or flat
with dotted keys), a YAML or JSON file of such fields (WORKDIR/config.json is one), a Python file
whose `get_config()` returns such a dict (or a RunConfig, or an ml_collections ConfigDict), and
`--config.a.b=value` overrides. Each value is checked against its field's type and range once, here;
every fault is one `UserError` naming the source, the field and what is valid.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import json
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kljax.config.run import RunConfig
from kljax.errors import UserError
from kljax.util.user_code import refuse_exit

DATA_SUFFIXES = (".yaml", ".yml", ".json")
SWEEP_FIELDS = ("base_config", "kl", "beta")  # what marks another command's config file
BIAS_STUDY_FIELDS = ("policy", "mode", "configs")
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"  # the shipped configs (a source checkout)
TRL_NAMES = {  # TRL's names of fields a TRL user reaches for, and kljax's
    "max_completion_length": "rl.max_new_tokens", "num_generations": "rl.group_size",
    "max_prompt_length": "rl.max_prompt_len", "beta": "kl.beta", "max_steps": "steps",
    "learning_rate": "optim.learning_rate", "per_device_train_batch_size": "rl.prompts_per_step x rl.group_size",
    "epsilon": "rl.clip_low", "epsilon_high": "rl.clip_high", "num_iterations": "rl.updates_per_batch",
}


# ---------------------------------------------------------------------------------------------- entry


def load_run_config(source: Any = None, overrides: Sequence[str] = (), base: RunConfig | None = None) -> RunConfig:
    """`source` (None: the defaults; a path to a .py/.yaml/.yml/.json file; a mapping of fields; a
    RunConfig) over `base` (default `RunConfig()`), then `overrides` ("--config.a.b=value"). The
    source's fields and the overrides are set together, so an override replaces a bad value of the
    file before any value is checked."""
    config = base or RunConfig()
    fields, where = {}, "the config"
    if isinstance(source, RunConfig):
        config = source
    elif isinstance(source, (str, os.PathLike)):
        value, where = read_file(Path(source)), f"config file {str(source)!r}"
        config, fields = (value, {}) if isinstance(value, RunConfig) else (config, value)
    elif _is_mapping(source):
        fields = _plain_mapping(source)
    elif source is not None:
        raise UserError(f"config={source!r} is a {type(source).__name__}; give a file path (.py, .yaml, .json), "
                        "a dict of fields or a RunConfig")
    data = nested(fields, where)
    check_shape(data, where)
    data = _merge(data, nested(override_fields(overrides), "the --config overrides"))
    return with_fields(config, data, where) if data else config


def with_fields(config: RunConfig, fields: Mapping[str, Any], source: str = "the config") -> RunConfig:
    """`config` with `fields` (nested or dotted keys) set; one UserError naming `source` for unknown,
    repeated, mistyped or out-of-range fields."""
    data = nested(_plain_mapping(fields), source)
    check_shape(data, source)
    return build(RunConfig, _merge(config.to_dict(), data), "config")


def check_shape(data: Mapping[str, Any], source: str) -> None:
    """A UserError naming `source` for keys RunConfig lacks, or a section set to a value."""
    unknown = _unknown_keys(data, merged_schema())
    if unknown:
        raise UserError(f"{source} has unknown key(s): {_describe_unknown(unknown)}")
    _check_sections(data, merged_schema(), source, "")


def _check_sections(data: Mapping[str, Any], schema: Mapping[str, Any], source: str, prefix: str) -> None:
    for key, value in data.items():
        if isinstance(schema.get(key), dict):
            if not isinstance(value, dict):
                raise UserError(f"{source} sets section {prefix + key!r} to {value!r} ({_article(_kind(value))}); a "
                                f"section is a mapping of its fields: {', '.join(sorted(schema[key]))}")
            _check_sections(value, schema[key], source, f"{prefix}{key}.")


def with_overrides(config: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """`config` with "--config.a.b=value" strings set, in order (a later one wins)."""
    fields = override_fields(overrides)
    return with_fields(config, fields, "the --config overrides") if fields else config


def override_fields(overrides: Sequence[str]) -> dict[str, Any]:
    """{"a.b": value} of "--config.a.b=value" strings, each value parsed for its field's type."""
    if isinstance(overrides, (str, bytes)):
        raise UserError(f"overrides={overrides!r} is a string; give a list of '--config.field=value' strings")
    fields: dict[str, Any] = {}
    for item in overrides:
        if not isinstance(item, str):
            raise UserError(f"override {item!r} is a {type(item).__name__}; give '--config.field=value' strings")
        key, sep, text = item.lstrip("-").partition("=")
        if not sep or not key.startswith("config.") or key == "config.":
            raise UserError(f"override {item!r} must look like --config.field=value")
        name = key[len("config."):]
        hint = field_hint(name)
        if hint is None:
            raise UserError(f"override {item!r}: unknown key {_describe_unknown([(name, _siblings(name))])}")
        fields[name] = parse_text(text, hint)
    return fields


# ---------------------------------------------------------------------------------------------- files


def read_file(path: Path) -> Mapping[str, Any] | RunConfig:
    """The fields of a .py / .yaml / .yml / .json config file (or the RunConfig a .py file returns)."""
    if not path.is_file():
        what = "is a directory, not a config file" if path.is_dir() else "does not exist"
        raise UserError(f"config file {str(path)!r} {what}")
    suffix = path.suffix.lower()
    if suffix in DATA_SUFFIXES:
        return read_mapping(path)
    if suffix != ".py":
        raise UserError(f"config file {str(path)!r} is not a .py, .yaml, .yml or .json file")
    value = python_config(path)
    if isinstance(value, RunConfig):
        return value
    if not _is_mapping(value):
        raise UserError(f"config file {str(path)!r}: get_config() returned a {type(value).__name__}, not a dict of "
                        "run config fields (a sweep config goes to `kljax sweep`, a bias-study config to "
                        "`kljax bias-study`)")
    fields = _plain_mapping(value)
    for marks, command in ((SWEEP_FIELDS, "kljax sweep"), (BIAS_STUDY_FIELDS, "kljax bias-study")):
        if set(marks) <= set(fields):
            raise UserError(f"config file {str(path)!r} is a {command.split()[1]} config, not a run config: "
                            f"`{command} --config {path}` takes it")
    return fields


def python_config(path: Path) -> Any:
    """`get_config()` of a Python file (its directory on sys.path meanwhile); whatever it raises, or
    an exit it asks for, is a UserError naming the file."""
    spec = importlib.util.spec_from_file_location(f"kljax_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    where = f"config file {str(path)!r}"
    try:
        with refuse_exit() as exited:
            spec.loader.exec_module(module)
            if not hasattr(module, "get_config"):
                raise UserError(f"{where} has no get_config()")
            value = module.get_config()
    except SyntaxError as e:
        raise UserError(f"{where} has a syntax error at line {e.lineno}: {e.msg}") from e
    except UserError:
        raise
    except SystemExit as e:
        raise UserError(f"{where} called sys.exit({e.code!r}) while loading; a config file must return its "
                        "fields from get_config()") from None
    except Exception as e:  # the user's code: report it as the file's error, not kljax's
        raise UserError(f"{where} failed to load: {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
    if exited.code is not None:
        raise UserError(f"{where} called os._exit({exited.code}) while loading; a config file must return its "
                        "fields from get_config()")
    return value


def read_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML or JSON file (an empty file is {}); duplicate keys are an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"config file {str(path)!r} is not UTF-8 text: {e.reason} at byte {e.start}") from e
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicates(path)) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise UserError(f"config file {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno} "
                            f"column {e.colno}") from e
    else:
        data = _read_yaml(path, text)
    if not isinstance(data, dict):
        raise UserError(f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping of config fields")
    return data


def _no_duplicates(path: Path) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                raise UserError(f"config file {str(path)!r} sets {key!r} twice")
            seen[key] = value
        return seen

    return pairs


def _read_yaml(path: Path, text: str) -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        keys = [loader.construct_object(k) for k, _ in node.value]
        repeated = sorted({str(k) for k in keys if keys.count(k) > 1})
        if repeated:
            raise UserError(f"config file {str(path)!r} sets {', '.join(map(repr, repeated))} twice (line "
                            f"{node.start_mark.line + 1})")
        return loader.construct_mapping(node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        data = yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise UserError(f"config file {str(path)!r} is not valid YAML: {problem}{where}") from e
    return {} if data is None else data


# ---------------------------------------------------------------------------------------------- fields


def nested(data: Mapping[str, Any], source: str = "the config") -> dict[str, Any]:
    """`{"rl.temperature": 1}` -> `{"rl": {"temperature": 1}}` (dotted keys at any level); a field set
    twice (dotted and nested) is a UserError naming it."""
    out: dict[str, Any] = {}

    def put(path: list[str], value: Any, full: str) -> None:
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"{source} sets {full!r} and its section {part!r} as a value")
            node = child
        leaf = path[-1]
        if leaf in node and not (isinstance(node[leaf], dict) and isinstance(value, dict)):
            raise UserError(f"{source} sets {full!r} twice (once dotted, once nested)")
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            for k, v in value.items():
                put([*path, k], v, f"{full}.{k}")
        else:
            node[leaf] = value

    def walk(mapping: Mapping[str, Any], prefix: list[str]) -> None:
        for key, value in mapping.items():
            if not isinstance(key, str):
                raise UserError(f"{source}: key {key!r} is a {type(key).__name__}; config keys are field names")
            path = [*prefix, *key.split(".")]
            if _is_mapping(value):
                put(path, {}, ".".join(path))
                walk(_plain_mapping(value), path)
            else:
                put(path, value, ".".join(path))

    walk(data, [])
    return out


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def merged_schema() -> dict[str, Any]:
    """{field: hint or nested schema} of RunConfig."""
    return _schema(RunConfig)


def _schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _schema(hints[f.name]) if _is_section(hints[f.name]) else hints[f.name]
            for f in dataclasses.fields(cls)}


def field_hint(dotted: str) -> Any:
    """The type hint of a dotted field of RunConfig, or None when there is no such field."""
    node: Any = merged_schema()
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _siblings(dotted: str) -> list[str]:
    node: Any = merged_schema()
    for part in dotted.split(".")[:-1]:
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    return sorted(node) if isinstance(node, dict) else []


def _unknown_keys(data: Mapping[str, Any], schema: Mapping[str, Any], prefix: str = "") -> list[tuple[str, list[str]]]:
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in schema:
            out.append((name, sorted(schema)))
        elif isinstance(schema[key], dict) and isinstance(value, dict):
            out.extend(_unknown_keys(value, schema[key], f"{name}."))
    return out


def _describe_unknown(unknown: list[tuple[str, list[str]]]) -> str:
    parts = []
    for name, valid in unknown:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in TRL_NAMES:
            parts.append(f"{name} (TRL's name; kljax's is {TRL_NAMES[leaf]})")
            continue
        close = difflib.get_close_matches(leaf, valid, n=1)
        parts.append(name + (f" (did you mean {close[0]!r}?)" if close else ""))
    first, valid = unknown[0]
    section = first.rsplit(".", 1)[0] if "." in first else ""
    return f"{', '.join(parts)}; valid{f' in {section}' if section else ' at the top level'}: {', '.join(valid)}"


# ---------------------------------------------------------------------------------------------- types


def build(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    """An instance of the frozen dataclass `cls` from a nested mapping, every value checked against
    its field's type (an int where a float is due becomes a float)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        hint, value, name = hints[f.name], values[f.name], f"{prefix}.{f.name}"
        if _is_section(hint):
            if not _is_mapping(value):
                raise UserError(f"{name}={value!r} is {_article(_kind(value))}; expected a section of fields")
            kwargs[f.name] = build(hint, value, name)
        else:
            kwargs[f.name] = convert(hint, value, name)
    try:
        return cls(**kwargs)
    except UserError:
        raise
    except ValueError as e:  # a section's own check (KLConfig's)
        raise UserError(str(e)) from None


def convert(hint: Any, value: Any, name: str) -> Any:
    """`value` as the type `hint` names, or a UserError naming the field, the value and the type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return convert(option, value, name)
            except UserError:
                continue
        raise _type_error(name, value, " or ".join(_hint_kind(o) for o in options)
                          + (" or None" if type(None) in args else ""))
    if origin is tuple:
        item = args[0]
        if isinstance(value, str) and item in (str, float):
            value = [v for v in value.split(",") if v.strip()] if item is float else list(_strip_split(value))
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise _type_error(name, value, "list")
        return tuple(convert(item, v, name) for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise _type_error(name, value, "float") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is Any:
        return value
    raise _type_error(name, value, _hint_kind(hint))


def parse_text(text: str, hint: Any) -> Any:
    """An override's text as a value for a field of type `hint`: a str field takes the text as written
    (quotes stripped), others a Python literal (`None`, `1e-5`, `[1, 2]`, `True`)."""
    if hint is str:
        try:
            value = ast.literal_eval(text)
            return value if isinstance(value, str) else text
        except (ValueError, SyntaxError):
            return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string, e.g. --config.rl.stop=</answer>; the type check names it if wrong


def _strip_split(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _type_error(name: str, value: Any, expected: str) -> UserError:
    return UserError(f"{name}={value!r} is {_article(_kind(value))}; expected {_article(expected)}")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (list, tuple)):
        return "list"
    if _is_mapping(value):
        return "section"
    return type(value).__name__


def _hint_kind(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        return "list"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_hint_kind(a) for a in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _article(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping) or hasattr(value, "to_dict") and hasattr(value, "keys")


def _plain_mapping(value: Any) -> Mapping[str, Any]:
    """A Mapping, or an ml_collections ConfigDict as the dict it holds."""
    return value.to_dict() if not isinstance(value, Mapping) and hasattr(value, "to_dict") else value
