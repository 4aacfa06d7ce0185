"""The `kljax` command line: one subcommand per job, each in its own module.

A subcommand module provides `configure(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int`; the table below is the only place that names them, and only
the module of the command asked for is imported (so `kljax --help` is fast). Errors go through the
one boundary (`kljax.boundary.run.run_command`). Started from the command line, `kljax` re-executes
itself once with glibc's huge-page malloc tunable set (`kljax.util.hostmem`; KLJAX_HUGEPAGES=0: off).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from kljax.boundary.interrupts import sticky_sigint
from kljax.boundary.run import run_command
from kljax.util.hostmem import reexec_with_malloc_tunables
from kljax.util.threads import ensure_collective_threads

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("kljax.cli.train", "RL fine-tuning with a chosen KL configuration (the main job)"),
    "eval": ("kljax.cli.evaluate", "greedy and sampled accuracy with 95%% intervals, pass@k, on task splits"),
    "generate": ("kljax.cli.generate", "generate text from a model directory or a run"),
    "export": ("kljax.cli.export", "write a run's trained policy as a Hugging Face checkpoint with its tokenizer"),
    "plot-run": ("kljax.cli.plot_run", "draw a run's metric curves as PNG"),
    "kl-configs": ("kljax.cli.kl_configs", "print every KL configuration and what its gradient is"),
    "audit": ("kljax.cli.audit", "another trainer's KL settings as the equal kljax configuration and its gradient"),
    "convert": ("kljax.cli.convert", "convert a Hugging Face checkpoint to kljax (and back)"),
    "plan": ("kljax.cli.plan", "per-device memory of a run on a given mesh (AOT compile, nothing allocated)"),
    "sweep": ("kljax.cli.sweep", "run a grid of RL runs (KL configurations x beta x seeds), resumable"),
    "report": ("kljax.cli.report", "report.md with tables and figures of a sweep directory"),
    "bias-study": ("kljax.cli.bias_study", "exact and Monte-Carlo gradient bias/variance of KL configurations"),
    "converge-study": ("kljax.cli.converge_study", "train each KL configuration to the exact optimum of toy tasks"),
    "bench": ("benchmarks.cli", "benchmarks against the tools users would pick instead (needs the bench extra)"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Commands whose module exists in this installation."""
    found = {}
    for name, (module, help_text) in COMMANDS.items():
        try:
            present = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its top-level package (`benchmarks`) is not installed
            present = False
        if present:
            found[name] = (module, help_text)
    return found


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; the options of `command` (None: of every command) are configured, which imports
    its module."""
    parser = argparse.ArgumentParser(
        prog="kljax",
        description="KL-regularized RL fine-tuning of LLMs in JAX, and gradient-bias studies of KL estimators.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a user error (bad value, path or file) instead of one line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _available().items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.set_defaults(_module=module)
        if command is None or name == command:
            importlib.import_module(module).configure(cmd)
    return parser


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def exit_after_interrupt() -> None:
    """End the process now with status 130. A Ctrl-C can land while XLA compiles a program on a
    background thread; the interpreter's teardown would free the client under it (a segfault after
    the one line). What kljax opened is closed by then (the trainer closes its files however it ends)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    """Run `kljax ARGV` (None: the command line, which first re-executes the process once with
    glibc's huge-page malloc tunable when that applies)."""
    ensure_collective_threads()  # simulated CPU devices: see kljax.util.threads
    if argv is None:
        reexec_with_malloc_tunables(sys.argv[1:])
        try:
            with sticky_sigint():  # a Ctrl-C during start-up (imports: JAX's gc callback) is not lost either
                code = main(sys.argv[1:])
        except KeyboardInterrupt:
            print("kljax: error: interrupted (Ctrl-C)", file=sys.stderr)
            code = 130
        if code == 130:
            exit_after_interrupt()
        return code
    command = _command_of(argv)
    parser = build_parser(command if command in COMMANDS else "")
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if "--debug" in extra:  # also accepted after the command's name
        extra.remove("--debug")
        args.debug = True
    module = importlib.import_module(args._module)
    sub = parser._subparsers._group_actions[0].choices[args.command]  # noqa: SLF001 - its own parser
    if getattr(module, "ACCEPTS_CONFIG_OVERRIDES", False):  # `--config.field=value` overrides
        bad = [e for e in extra if not e.startswith("--config.")]
        if bad:
            sub.error(f"unrecognized arguments: {' '.join(bad)}")
        args.overrides = extra
    elif extra:
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return run_command(args.command, lambda: module.run(args), getattr(args, "debug", False))


if __name__ == "__main__":
    sys.exit(main())
