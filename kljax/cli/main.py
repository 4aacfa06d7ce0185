"""The `kljax` command line: one subcommand per job, each in its own module.

A subcommand module provides `configure(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int`. Heavy imports (torch, transformers) stay inside `run`, so
`kljax --help` is fast. The table below is the only place that names them. Started from the
command line, `kljax` re-executes itself once with glibc's huge-page malloc tunable set (about 17%
faster train steps on CPU, see `kljax.kernels.cpu.hostmem`; KLJAX_HUGEPAGES=0 turns it off).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "kl-configs": ("kljax.cli.kl_configs", "print every KL configuration and what its gradient is"),
    "bias-study": ("kljax.cli.bias_study", "exact and Monte-Carlo gradient bias/variance of KL configurations"),
    "converge-study": ("kljax.cli.converge_study", "train each KL configuration to the exact optimum of toy tasks"),
    "convert": ("kljax.cli.convert", "convert a Hugging Face checkpoint to kljax (and back)"),
    "generate": ("kljax.cli.generate", "generate text from a model directory"),
    "export": ("kljax.cli.export", "write a run's trained policy as a Hugging Face checkpoint with its tokenizer"),
    "train": ("kljax.cli.train", "RL fine-tuning with a chosen KL configuration (the main job)"),
    "plot-run": ("kljax.cli.plot_run", "draw a run's metric curves as PNG"),
    "plan": ("kljax.cli.plan", "per-device memory of a run on a given mesh (AOT compile, nothing allocated)"),
    "eval": ("kljax.cli.evaluate", "greedy accuracy, mean@k and pass@k on in- and out-of-domain task splits"),
    "sweep": ("kljax.cli.sweep", "run a grid of RL runs (KL configurations x beta x seeds), resumable"),
    "report": ("kljax.cli.report", "report.md with tables and figures of a sweep directory"),
    "bench": ("benchmarks.cli", "benchmarks against the tools users would pick instead (needs the bench extra)"),
    "audit": ("kljax.cli.audit", "another trainer's KL settings as the equal kljax configuration and its gradient"),
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kljax",
        description="KL-regularized RL fine-tuning of LLMs in JAX, and gradient-bias studies of KL estimators.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a user error (bad value, path or file) instead of one line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _available().items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).configure(cmd)
        cmd.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `kljax ARGV` (None: the command line, which first re-executes the process once with
    glibc's huge-page malloc tunable when that applies, see `kljax.kernels.cpu.hostmem`)."""
    from kljax.kernels.cpu.threads import ensure_collective_threads

    ensure_collective_threads()  # simulated CPU devices: see kljax.kernels.cpu.threads
    if argv is None:
        from kljax.kernels.cpu.hostmem import reexec_with_malloc_tunables

        reexec_with_malloc_tunables(sys.argv[1:])
        from kljax.train.interrupts import sticky_sigint

        try:
            with sticky_sigint():  # a Ctrl-C during start-up (imports: JAX's gc callback) is not lost either
                return main(sys.argv[1:])
        except KeyboardInterrupt:
            print("kljax: error: interrupted (Ctrl-C)", file=sys.stderr)
            return 130
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if "--debug" in extra:  # also accepted after the command's name
        extra.remove("--debug")
        args.debug = True
    module = importlib.import_module(args._module)
    # Commands that read an ml_collections config take `--config.field=value` overrides.
    if getattr(module, "ACCEPTS_CONFIG_OVERRIDES", False):
        bad = [e for e in extra if not e.startswith("--config.")]
        if bad:
            parser.error(f"unrecognized arguments: {' '.join(bad)}")
        args.overrides = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return run_command(module, args)


def run_command(module: object, args: argparse.Namespace) -> int:
    """`module.run(args)`; a user error (`kljax.errors.USER_ERRORS`) prints one line
    `kljax COMMAND: error: MESSAGE` to stderr and returns 2 (Ctrl-C: one line, 130), or is re-raised
    with `--debug`."""
    from kljax.errors import USER_ERRORS, UserError, one_line
    from kljax.train.interrupts import check, reported, sticky_sigint
    from kljax.train.io_errors import disk_fault_message

    try:
        with sticky_sigint():  # a Ctrl-C is never lost (see kljax.train.interrupts)
            code = int(module.run(args) or 0)
            check()  # one whose KeyboardInterrupt was lost is no success
            return code
    except KeyboardInterrupt as e:
        reported()
        if getattr(args, "debug", False):
            raise
        print(f"kljax {args.command}: error: {one_line(e) if str(e) else 'interrupted (Ctrl-C)'}", file=sys.stderr)
        return 130
    except Exception as e:  # a user error, or a read-only or full disk anywhere in the chain
        message = one_line(e) if isinstance(e, UserError) else disk_fault_message(e)
        if message is None and isinstance(e, USER_ERRORS):
            message = one_line(e)
        if getattr(args, "debug", False) or message is None:
            raise
        print(f"kljax {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
