"""The README's two set-up commands stay true: CI runs the test command verbatim, and the
main-job command names a subcommand that exists."""

from __future__ import annotations

import re
from pathlib import Path

from kljax.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README must open with a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    main_job, test_cmd = readme_commands()[:2]
    assert "pytest" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text().splitlines()
    assert main_job.startswith("bash launch/setup.sh && .venv/bin/kljax ")


def test_main_job_subcommand_exists():
    main_job = readme_commands()[0]
    sub = main_job.split(".venv/bin/kljax ")[1].split()[0]
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert sub in choices, f"README main job uses 'kljax {sub}', which is not a command: {sorted(choices)}"
