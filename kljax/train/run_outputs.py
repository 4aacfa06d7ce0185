"""What a finished run leaves in its workdir, and the commands to try next: the lines `kljax train`
prints at the end of a run (only what exists is listed, with the checkpoints' size on disk)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

FILES = (  # (name, what it holds); a name ending in / is a directory
    ("metrics.jsonl", "one row of metrics per step"),
    ("eval_before.json", "evaluation before training: greedy and sampled accuracy, 95% intervals"),
    ("eval_after.json", "the same after training, and the paired change (delta_vs_before)"),
    ("samples.jsonl", "prompts, completions and rewards (log_samples_every)"),
    ("config.json", "the run's settings (kljax train --config it to rerun)"),
    ("tb/", "TensorBoard events"),
    ("wandb/", "Weights & Biases files (wandb sync uploads an offline run)"),
)


def disk_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                pass
    return total


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):  # as du -h counts
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def export_dir(workdir: Path) -> Path:
    """Where the listing suggests exporting WORKDIR: beside it (`runs/a` -> `runs/a-hf`); export refuses
    an --out inside the run it reads."""
    beside = workdir if workdir.name not in ("", "..") else workdir.resolve()  # "." or "..": by its own name
    return beside.with_name(f"{beside.name}-hf")


def kljax_command(executable: str | None = None, cwd: Path | None = None, which: Any = shutil.which) -> str:
    """How to run kljax here, as the suggested commands print it: `kljax` when that is on the PATH and is
    this installation's, else this installation's script (`.venv/bin/kljax` from the directory holding
    .venv, after `launch/setup.sh`), else `PYTHON -m kljax`."""
    bin_dir = Path(executable or sys.executable).parent
    script = bin_dir / "kljax"
    found = which("kljax")
    if found and script.exists() and Path(found).resolve() == script.resolve():
        return "kljax"
    here = (cwd or Path.cwd()).resolve()
    target = script if script.exists() else Path(executable or sys.executable)
    try:
        shown = str(target.absolute().relative_to(here))
        shown = shown if "/" in shown else f"./{shown}"
    except ValueError:
        shown = str(target.absolute())
    return shlex.quote(shown) if script.exists() else f"{shlex.quote(shown)} -m kljax"


def tensorboard_command(kljax: str, which: Any = shutil.which) -> str | None:
    """`tensorboard` beside the kljax script shown (a venv's), else on the PATH, else None."""
    if "/" in kljax and " " not in kljax and (Path(kljax).parent / "tensorboard").exists():
        return shlex.quote(str(Path(kljax).parent / "tensorboard"))
    return "tensorboard" if which("tensorboard") else None


def example_prompt(workdir: Path) -> str | None:
    """A prompt of the run's own evaluation (eval_after.json, else eval_before.json), as text: what
    `kljax generate --checkpoint` is shown with (a chat prompt: its last user message)."""
    for name in ("eval_after.json", "eval_before.json"):
        try:
            results = json.loads((workdir / name).read_text())
        except (OSError, ValueError):
            continue
        for entry in results.values() if isinstance(results, dict) else ():
            prompt = (entry.get("example") or {}).get("prompt") if isinstance(entry, dict) else None
            if isinstance(prompt, list):  # chat messages
                users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
                prompt = users[-1] if users else None
            if isinstance(prompt, str) and prompt.strip():
                return prompt
    return None


def output_lines(workdir: str | os.PathLike, kljax: str | None = None) -> list[str]:
    """The end-of-run lines: where the outputs are and the next commands (see the module docstring),
    each starting with `kljax` (default `kljax_command()`)."""
    kljax = kljax or kljax_command()
    workdir = Path(workdir)
    try:
        config = json.loads((workdir / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    w = shlex.quote(str(workdir))
    lines = [f"outputs in {workdir}:"]
    ckpt = workdir / "checkpoints"
    steps = sorted((int(p.name) for p in ckpt.iterdir() if p.name.isdigit()), reverse=True) if ckpt.is_dir() else []
    if steps:
        lines.append(f"  {'checkpoints/':<18} step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}: "
                     f"parameters and optimizer state, {_size(disk_bytes(ckpt))} (keep_checkpoints sets how many)")
    for name, what in FILES:
        if (workdir / name.rstrip("/")).exists():
            lines.append(f"  {name:<18} {what}")
    evals = sorted(p.name for p in workdir.glob("eval_step_*.json"))
    if evals:
        lines.append(f"  {'eval_step_N.json':<18} evaluation during training ({len(evals)} files)")
    toy = str((config.get("task") or {}).get("name", "")) == "toy_optimum"  # no text: nothing to generate
    commands = [(f"{kljax} plot-run {w}", "curves.png of the metrics")]
    tensorboard = tensorboard_command(kljax)
    if (workdir / "tb").is_dir() and tensorboard:  # only where it is installed (launch/setup.sh does not)
        commands.append((f"{tensorboard} --logdir {shlex.quote(str(workdir / 'tb'))}", "the curves, live"))
    if steps and not toy:
        prompt = example_prompt(workdir)
        if prompt is not None:
            commands.append((f"{kljax} generate --checkpoint {w} --prompt {shlex.quote(prompt)}",
                             "the trained policy on one of its problems"))
        commands += [(f"{kljax} eval --checkpoint {w}", "accuracy with 95% intervals, pass@k"),
                     (f"{kljax} export {w} --out {shlex.quote(str(export_dir(workdir)))}",
                      "a Hugging Face checkpoint with its tokenizer")]
    width = max(len(c) for c, _ in commands)
    lines.append("next:")
    lines += [f"  {c:<{width}}  # {what}" for c, what in commands]
    return lines
