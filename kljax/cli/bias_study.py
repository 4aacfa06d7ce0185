"""`kljax bias-study`: exact and Monte-Carlo bias/variance of KL-gradient configurations.

Examples:
  kljax bias-study                                   # the default study (~20-30 s on 2 CPU cores)
  kljax bias-study --exact --configs grid            # every valid configuration, exact only
  kljax bias-study --samples 64 --repeats 512        # Monte Carlo, batches of 64 sequences
  kljax bias-study --configs k3-loss,k1-reward --config.staleness=8 --out runs/bias --json runs/bias.json
  kljax bias-study --config configs/bias_transformer.py --out runs/bias-tf

Every field of the config file can be overridden as --config.FIELD=VALUE (tuples as (1,2,3)).
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path
from typing import Any

import ml_collections

from kljax.config.load import python_config
from kljax.errors import UserError
from kljax.studies.bias import plots, report
from kljax.studies.bias.study import run_study

DEFAULT_CONFIG = "configs/bias_default.py"


def default_config_path() -> Path:
    """configs/bias_default.py in the working directory, else the one in kljax's repository."""
    here = Path(DEFAULT_CONFIG)
    if here.exists():
        return here
    return Path(__file__).resolve().parents[2] / DEFAULT_CONFIG


def load_config(path: str | Path) -> ml_collections.ConfigDict:
    """get_config() of a bias-study config file (a .py file returning an ml_collections ConfigDict)."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a config file" if path.is_dir() else "does not exist"
        raise UserError(f"config file {str(path)!r} {what} (try {DEFAULT_CONFIG})")
    if path.suffix.lower() != ".py":
        raise UserError(f"config file {str(path)!r}: this command takes a Python config file with get_config()")
    return python_config(path)


def _parse_value(text: str, current: Any) -> Any:
    if isinstance(current, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    if isinstance(current, tuple) and not isinstance(value, tuple):
        value = (value,)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """config.<key> = parsed text; unknown keys list the valid ones."""
    *parents, leaf = key.split(".")
    node = config
    for p in parents:
        if p not in node:
            raise ValueError(f"unknown config field {key!r}; valid fields: {sorted(config.keys())}")
        node = node[p]
    if leaf not in node:
        raise ValueError(f"unknown config field {key!r}; valid fields: {sorted(node.keys())}")
    try:
        node[leaf] = _parse_value(text, node[leaf])
    except TypeError as err:
        raise ValueError(f"--config.{key}={text!r}: {err}") from None


class _Override(argparse.Action):
    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option=None
    ) -> None:
        items = list(getattr(namespace, self.dest) or [])
        items.append((option[len("--config.") :], values))
        setattr(namespace, self.dest, items)


def _fields(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            out += _fields(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the bias-study flags (and --config.FIELD for every field of the default config)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n", 2)[2]
    parser.add_argument("--config", default=None, help=f"ml_collections config file (default {DEFAULT_CONFIG})")
    parser.add_argument("--exact", action="store_true", help="exact enumeration only (no Monte Carlo)")
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help="batch size B; alone it selects Monte-Carlo mode (with --exact: exact variance at B)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="Monte-Carlo batches per estimate")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the setting and the sampling")
    parser.add_argument("--configs", default=None, help="'presets', 'grid', 'paper' or names, e.g. k1-reward,k3-loss")
    parser.add_argument("--out", default=None, help="directory for study.json, *.csv and *.png")
    parser.add_argument("--json", default=None, help="write a JSON list, one entry per configuration, here")
    parser.add_argument("--markdown", default=None, help="write the markdown table (docs/bias_table.md) here")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    try:
        fields = _fields(load_config(default_config_path()))
    except ValueError:
        fields = []
    for field in fields:
        parser.add_argument(f"--config.{field}", dest="overrides", action=_Override, help=argparse.SUPPRESS)


OPTIONAL_FIELDS = ("mc_chunk_size", "transformer", "plots")  # the study has defaults for these


def check_is_bias_config(config: Any, path: str | Path) -> None:
    """UserError unless `config` has every field of the default bias-study config (a run config,
    e.g. configs/tiny.py, has none of them)."""

    if isinstance(config, dict) and {"model", "task", "rl"} & {k.split(".")[0] for k in config}:
        config = ml_collections.ConfigDict({k.split(".")[0]: v for k, v in config.items()})  # a run config's fields
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(f"{path}: get_config() returned a {type(config).__name__}, not a bias-study config")
    needed = [k for k in load_config(default_config_path()).keys() if k not in OPTIONAL_FIELDS]
    first = ("policy", "mode", "configs", "vocab", "length")  # named first: what makes it a bias study
    missing = sorted((k for k in needed if k not in config), key=lambda k: (k not in first, first.index(k)
                                                                              if k in first else 0, k))
    if missing:
        run_config = any(k in config for k in ("model", "task", "rl"))
        hint = " (it is a run config: `kljax train` takes it)" if run_config else ""
        shown = missing[:4] + (["..."] if len(missing) > 4 else [])
        raise UserError(f"{path} is not a bias-study config{hint}: it lacks {len(missing)} of its fields "
                        f"({', '.join(shown)}); start from {DEFAULT_CONFIG}")


def build_config(args: argparse.Namespace) -> ml_collections.ConfigDict:
    """The config file plus --config.FIELD overrides plus the convenience flags."""
    path = args.config or default_config_path()
    config = load_config(path)
    check_is_bias_config(config, path)
    for key, text in getattr(args, "overrides", None) or []:
        apply_override(config, key, text)
    if args.samples is not None:
        config.samples = args.samples
        config.mode = "exact" if args.exact else "montecarlo"
    elif args.exact:
        config.mode = "exact"
    for name in ("repeats", "seed", "configs"):
        if getattr(args, name) is not None:
            config[name] = getattr(args, name)
    config.config_file = str(path)
    return config


def run(args: argparse.Namespace) -> int:
    """Run the study, print the table, write the requested files. 0 on success, 2 on bad input."""

    start = time.perf_counter()
    for flag in ("out",):
        path = getattr(args, flag)
        if path and Path(path).exists() and not Path(path).is_dir():
            print(f"kljax bias-study: error: --{flag} {path} is an existing file; give a directory", file=sys.stderr)
            return 2
    for flag in ("json", "markdown"):
        path = getattr(args, flag)
        if path and Path(path).is_dir():
            print(f"kljax bias-study: error: --{flag} {path} is a directory; give a file path", file=sys.stderr)
            return 2
    try:
        config = build_config(args)
        result = run_study(config, progress=not args.no_progress)
    except ValueError as err:
        print(f"kljax bias-study: error: {err}", file=sys.stderr)
        return 2
    written = []
    if args.out:
        written += report.write_outputs(result, args.out)
        if not args.no_plots and config.get("plots", True):
            written += plots.save_all(result, args.out)
    if args.json:
        written.append(report.write_json(report.json_entries(result), args.json))
    if args.markdown:
        written.append(report.write_markdown(result, args.markdown))
    result["timing"]["total_s"] = round(time.perf_counter() - start, 3)
    print(report.format_table(result))
    if written:
        print("wrote: " + ", ".join(str(p) for p in written))
    else:
        print("(add --out DIR for JSON, CSV and PNG figures; --json PATH for one entry per configuration)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kljax bias-study", description=__doc__.split("\n")[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
