"""What a finished run leaves in its workdir, and the commands to try next: the lines `kljax train`
prints at the end of a run (only what exists is listed, with the checkpoints' size on disk)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

FILES = (  # (name, what it holds); a name ending in / is a directory
    ("metrics.jsonl", "one row of metrics per step"),
    ("eval_before.json", "greedy evaluation before training"),
    ("eval_after.json", "greedy evaluation after training"),
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


def output_lines(workdir: str | os.PathLike) -> list[str]:
    """The end-of-run lines: where the outputs are and the next commands (see the module docstring)."""
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
    commands = [(f"kljax plot-run {w}", "curves.png of the metrics")]
    if (workdir / "tb").is_dir():
        commands.append((f"tensorboard --logdir {shlex.quote(str(workdir / 'tb'))}", "the curves, live"))
    if steps and not toy:
        commands += [(f"kljax generate --checkpoint {w} --prompt '...'", "the trained policy, prompted as the run"),
                     (f"kljax eval --checkpoint {w} --k 4", "accuracy, mean@k, pass@k"),
                     (f"kljax export {w} --out {shlex.quote(str(export_dir(workdir)))}",
                      "a Hugging Face checkpoint with its tokenizer")]
    width = max(len(c) for c, _ in commands)
    lines.append("next:")
    lines += [f"  {c:<{width}}  # {what}" for c, what in commands]
    return lines
