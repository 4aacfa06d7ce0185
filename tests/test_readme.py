"""The README stays true: CI runs its test command verbatim, the main-job command names a
subcommand that exists, the sections a newcomer needs come first, every linked file exists, the
command table lists every command, and its examples (the end-of-run listing, the YAML config) are
what kljax prints and accepts."""

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


def _section_starts(text: str) -> dict[str, int]:
    return {line[3:]: i for i, line in enumerate(text.splitlines()) if line.startswith("## ")}


def test_readme_leads_a_newcomer_from_the_api_to_the_commands():
    """After the set-up: the Python API, Coming from TRL, the KL table, then the commands; the
    measurements and host tuning live in docs/."""
    text = (ROOT / "README.md").read_text()
    at = _section_starts(text)
    order = ["Python API", "Coming from TRL", "The KL configurations, in a practitioner's words", "Command line"]
    assert all(name in at for name in order), sorted(at)
    assert [at[n] for n in order] == sorted(at[n] for n in order)
    assert at["Python API"] == min(at.values())
    for moved in ("Experiments: does this scale agree with the paper?", "Performance", "Host memory"):
        assert f"## {moved}\n" not in text and f"### {moved}\n" not in text


def test_every_link_to_a_file_exists():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_command_table_lists_every_command():
    text = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `kljax ([a-z-]+)", text, re.M))
    choices = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert listed == set(choices)


def test_the_end_of_run_listing_is_what_kljax_train_prints(tmp_path, monkeypatch):
    """The README's example of the lines `kljax train` ends with (kljax/train/run_outputs.py) for a
    workdir holding what the default run writes; only the checkpoints' size differs."""
    from kljax.train.run_outputs import output_lines

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(outputs in runs/default:\n.*?)```", text, re.S)
    assert block, "README shows the end-of-run listing"
    shown = block.group(1).rstrip("\n").splitlines()
    monkeypatch.chdir(tmp_path)
    work = Path("runs/default")
    (work / "checkpoints" / "15").mkdir(parents=True)
    (work / "checkpoints" / "15" / "state").write_bytes(b"0" * 1000)
    (work / "tb").mkdir()
    for name in ("metrics.jsonl", "eval_before.json", "eval_after.json"):
        (work / name).write_text("{}\n")
    (work / "config.json").write_text('{"task": {"name": "arithmetic"}}')
    printed = output_lines(work)

    def without_size(lines: list[str]) -> list[str]:
        return [re.sub(r"state, [0-9.]+ [KMG]?i?B", "state, SIZE", line) for line in lines]

    assert without_size(shown) == without_size(printed)


def test_the_readme_yaml_config_is_a_valid_run_config(tmp_path):
    from kljax.config import load_run_config

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block
    path = tmp_path / "run.yaml"
    path.write_text(block.group(1))
    settings = load_run_config(path)
    assert settings.rl.stop == ("0",) and settings.rl.min_p == 0.05


def test_every_documented_export_writes_outside_the_run_it_reads(tmp_path, monkeypatch):
    """`kljax export RUN --out OUT` in the README and docs/: export refuses an OUT that is, lies
    inside or contains RUN (the run must survive), so no documented command may name one."""
    from kljax.errors import UserError
    from kljax.util.owned_paths import check_apart

    monkeypatch.chdir(tmp_path)
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for run, out in re.findall(r"kljax export (\S+) (?:\S+ )*?--out (\S+)", doc.read_text()):
            found.append((doc.name, run, out))
            try:
                check_apart(out, run)
            except UserError as e:
                raise AssertionError(f"{doc.name}: kljax export {run} --out {out}: {e}") from None
    assert len(found) >= 3, found
