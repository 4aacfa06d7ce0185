"""`kljax plot-run WORKDIR`: the curves of a run's metrics.jsonl as one PNG grid."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

DEFAULT_KEYS = ("reward", "accuracy", "kl_seq", "k3", "entropy", "grad_norm", "response_length", "clip_fraction",
                "pg_loss", "kl_loss", "tokens_per_s", "time_step")


def plot_run(workdir: str | Path, keys: tuple[str, ...] = DEFAULT_KEYS, out: str | Path | None = None) -> Path:
    """Draw each metric against the step; returns the PNG path (default WORKDIR/curves.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kljax.metrics import read_jsonl

    workdir = Path(workdir)
    rows = read_jsonl(workdir / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{workdir / 'metrics.jsonl'} has no rows: is {workdir} a kljax train workdir?")
    keys = tuple(k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows))
    cols = 4
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.suptitle(str(workdir))
    fig.tight_layout()
    out = Path(out) if out else workdir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", help="a `kljax train` workdir")
    parser.add_argument("--out", default=None, help="PNG path (default WORKDIR/curves.png)")
    parser.add_argument("--keys", default=",".join(DEFAULT_KEYS), help="comma-separated metric names")


def run(args: argparse.Namespace) -> int:
    path = plot_run(args.workdir, tuple(k for k in args.keys.split(",") if k), args.out)
    print(path)
    return 0
