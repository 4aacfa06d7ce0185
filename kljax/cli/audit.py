"""`kljax audit PEER [key=value ...] [--file FILE] [--json]`: another trainer's KL settings as a
kljax configuration, with its expected gradient (`kljax.verdicts.audit`, `kljax.verdicts.objective`): "equivalent"
where the two gradients agree, "approximately" with each difference named and measured otherwise.

Settings come from FILE (JSON, or YAML; nested sections flatten to dotted keys, as verl's) and
then from key=value arguments, which win. A value is parsed as JSON where it can be (true, 0.04,
null), else kept as a string.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from kljax.errors import UserError
from kljax.verdicts.audit import overrides, translation
from kljax.verdicts.objective import describe_objective
from kljax.verdicts.peers import PEERS, canonical, settings_with_defaults


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("peer", metavar="PEER", help=f"the peer trainer: {', '.join(PEERS)}")
    parser.add_argument("settings", nargs="*", metavar="key=value",
                        help="a peer setting, before any option (JSON value where possible: true, 0.04, null; "
                             "else a string)")
    parser.add_argument("--file", default=None, help="settings as a JSON or YAML file (.json, .yaml, .yml)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """`["beta=0.04", "loss_type=grpo"]` -> {"beta": 0.04, "loss_type": "grpo"}; UserError without '='."""
    out: dict[str, Any] = {}
    for item in pairs:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"setting {item!r} must look like key=value")
        try:
            out[key] = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            out[key] = text
        _check_finite(key, out[key], f"setting {item!r}")
    return out


def _check_finite(key: str, value: Any, where: str) -> None:
    """A float setting must be finite: 1e999 reads as inf, which no peer trainer can mean."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: {key}={value!r} is not a finite number; give a value within float range")


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def read_settings(path: str) -> dict[str, Any]:
    """The settings in a .json/.yaml/.yml file, nested sections flattened to dotted keys."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"settings file {file} does not exist")
    if file.suffix not in (".json", ".yaml", ".yml"):
        raise UserError(f"settings file {file}: use .json, .yaml or .yml")
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UserError(f"settings file {file} is not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} "
                        f"(line {line}); save it as UTF-8") from None
    try:
        data = _parse(file, text)
        if not isinstance(data, dict):
            raise UserError(f"settings file {file} must hold a mapping of setting names to values")
        flat = _flatten(data)
    except RecursionError:
        raise UserError(f"settings file {file} nests too deeply to read (past Python's recursion limit "
                        f"of {sys.getrecursionlimit()} frames); "
                        "settings are a mapping a few sections deep") from None
    for key, value in flat.items():
        _check_finite(key, value, f"settings file {file}")
    return flat


def _parse(file: Path, text: str) -> Any:
    """The JSON or YAML value of `text` (the contents of `file`); UserError naming the file if invalid."""
    if file.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"settings file {file} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") \
                from None
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - PyYAML ships with transformers
        raise UserError(f"settings file {file}: reading YAML needs PyYAML; use a .json file") from e
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"settings file {file} is not valid YAML: {' '.join(str(e).split())}") from None


def audit(peer: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Everything `kljax audit` prints, as one JSON-able dict."""
    values = settings_with_defaults(peer, settings)
    given = canonical(peer, settings)[0]
    mapped = translation(peer, settings)
    run, notes = mapped.run, mapped.notes
    info = describe_objective(run)
    spec = PEERS[peer]
    used = [{"name": f.name, "value": values[f.name], "default": f.default, "is_default": f.name not in given,
             "source": f.source, "confirmed": f.confirmed, "note": f.note} for f in spec.fields]
    kljax = {"kl": dataclasses.asdict(run.kl), **{k: v for k, v in dataclasses.asdict(run).items() if k != "kl"}}
    return {"peer": peer, "trainer": spec.trainer, "section": spec.section, "version": spec.version,
            "settings": used, "kljax": kljax, "overrides": overrides(run), "name": info.name,
            "verdict": info.verdict, "scale": info.scale, "gradient": info.gradient, "kl_gradient": info.kl.gradient,
            "reasons": list(info.reasons), "mapping": "exact" if mapped.exact else "approximate",
            "approximations": list(mapped.approximations), "notes": list(notes)}


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args.file) if args.file else {}
    settings.update(parse_pairs(args.settings))
    report = audit(args.peer, settings)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['trainer']} {report['section']}, defaults read from {report['version']}")
    print("settings used (* = peer default, ? = default not confirmed):")
    for s in report["settings"]:
        mark = ("*" if s["is_default"] else " ") + ("?" if s["is_default"] and not s["confirmed"] else " ")
        print(f"  {mark} {s['name']} = {json.dumps(s['value'])}")
    if report["mapping"] == "exact":
        print("kljax equivalent (the same gradient as the peer's code):")
    else:
        print("kljax nearest: approximately the peer's objective; differences:")
        for difference in report["approximations"]:
            print(f"  ~ {difference}")
    print("  kljax train --workdir runs/audit " + " ".join(report["overrides"]))
    print(f"verdict: {report['verdict']} ({report['name']})")
    print(f"expected gradient: {report['gradient']}")
    print(f"KL part: {report['kl_gradient']}")
    unconfirmed = [s for s in report["settings"] if s["is_default"] and not s["confirmed"]]
    if report["notes"] or unconfirmed:
        print("notes:")
        for note in report["notes"]:
            print(f"  - {note}")
        for s in unconfirmed:
            print(f"  - {s['name']}: default not confirmed: {s['note']}")
    return 0
