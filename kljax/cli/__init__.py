"""The `kljax` command line: `kljax.cli.main` builds the parser from one table of subcommands, and
each subcommand lives in `kljax/cli/<command>.py` with `configure(parser)` and `run(args) -> int`."""

from kljax.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
