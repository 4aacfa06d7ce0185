"""`kljax plot-run WORKDIR`: the curves of a run's metrics.jsonl as one PNG grid."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from kljax.boundary.disk_faults import disk_fault_message
from kljax.errors import UserError, read_json
from kljax.train.metrics import read_jsonl
from kljax.util.owned_paths import check_output

DEFAULT_KEYS = ("exact/gap", "exact/J", "exact/kl_opt",  # tasks with an exact optimum (toy_optimum) only
                "reward", "accuracy", "kl_seq", "beta", "k3", "entropy", "grad_norm", "response_length",
                "clip_fraction", "pg_loss", "kl_loss", "tokens_per_s", "time_step")
EVAL_PANEL = "eval (greedy accuracy)"


def plot_run(workdir: str | Path, keys: tuple[str, ...] = DEFAULT_KEYS, out: str | Path | None = None,
             overwrite: bool = False) -> Path:
    """Draw each metric against the step, and the evaluations during the run (config.eval_every, with
    eval_before/eval_after.json at the ends) as points; the title names the KL configuration and beta
    (WORKDIR/config.json). Returns the PNG path (default WORKDIR/curves.png); a PNG kljax did not write
    is replaced only with `overwrite` (`owned_paths.check_output`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workdir = Path(workdir)
    rows = read_jsonl(workdir / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{workdir / 'metrics.jsonl'} has no rows: is {workdir} a kljax train workdir?")
    keys = tuple(k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows))
    evals = eval_points(workdir, rows)
    if evals:
        keys = (*keys, EVAL_PANEL)
    cols = 4
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        if key == EVAL_PANEL:
            for split, pts in sorted(evals.items()):
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", lw=1, ms=4, label=split)
            ax.legend(fontsize=7)
            ax.set_title(key, fontsize=10)
            ax.set_xlabel("step", fontsize=8)
            ax.grid(alpha=0.3)
            continue
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2)
        if key == "exact/gap" and all(p[1] > 0 for p in pts):  # a distance to pi*: its decades matter
            ax.set_yscale("log")
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.suptitle(f"{workdir}\n{run_title(workdir)}", fontsize=10)
    fig.tight_layout()
    out = check_output(output_path(workdir, out), "--out", overwrite=overwrite)
    try:
        fig.savefig(out, dpi=100, format="png", metadata={"Software": "kljax plot-run"})
    except OSError as e:  # a full or read-only disk: name the file (a failed write() names none)

        message = disk_fault_message(e, str(out))
        if message is None:
            raise
        raise UserError(message) from e
    finally:
        plt.close(fig)
    return out


DEFAULT_NAME = "curves.png"


def output_path(workdir: str | Path, out: str | Path | None) -> Path:
    """Where the PNG goes: WORKDIR/curves.png by default; OUT/curves.png for a directory OUT (an
    existing one, or a path ending in '/'); OUT itself for a .png path, OUT.png for a path without a
    suffix. UserError for another suffix (plot-run writes PNG only) or a parent that is a file."""

    if out is None:
        return Path(workdir) / DEFAULT_NAME
    text = str(out)
    path = Path(text)
    if path.is_dir() or text.endswith(("/", "\\")):
        path = path / DEFAULT_NAME
    elif path.suffix == "":
        path = path.with_name(path.name + ".png")
    elif path.suffix.lower() != ".png":
        raise UserError(f"--out {text}: plot-run writes PNG; give a .png path or a directory")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"--out {text}: {parent} is a file, not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _read_json(path: Path) -> object:

    return read_json(path)


def run_title(workdir: Path) -> str:
    """The KL configuration and beta of a run (from WORKDIR/config.json; "" without one)."""
    path = Path(workdir) / "config.json"
    if not path.is_file():
        return ""
    config = _read_json(path)
    kl = config.get("kl", {}) if isinstance(config, dict) else {}
    parts = [f"KL {kl.get('estimator')} in {kl.get('placement')}", f"credit {kl.get('credit')}",
             f"scope {kl.get('scope')}", f"off-policy {kl.get('off_policy')}", f"beta {kl.get('beta')}"]
    if kl.get("target_kl") is not None:
        parts.append(f"adaptive to target KL {kl['target_kl']}")
    return ", ".join(parts)


def eval_points(workdir: Path, rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """{split: [(step, greedy accuracy)]}: eval_before.json at step 0, the eval/SPLIT/accuracy entries of
    metrics.jsonl, eval_after.json at the last step."""
    points: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("eval/") and k.endswith("/accuracy") and isinstance(v, (int, float)):
                points.setdefault(k[len("eval/"):-len("/accuracy")], []).append((r["step"], v))
    for name, step in (("eval_before.json", 0), ("eval_after.json", max(r["step"] for r in rows))):
        path = Path(workdir) / name
        if path.is_file():
            results = _read_json(path)
            for split, result in (results.items() if isinstance(results, dict) else ()):
                if isinstance(result, dict) and isinstance(result.get("accuracy"), (int, float)):
                    points.setdefault(split, []).append((step, result["accuracy"]))
    return {split: sorted(pts) for split, pts in points.items()}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", help="a `kljax train` workdir")
    parser.add_argument("--out", default=None,
                        help="PNG path, or a directory for DIR/curves.png (default WORKDIR/curves.png)")
    parser.add_argument("--keys", default=",".join(DEFAULT_KEYS), help="comma-separated metric names")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out PNG that kljax did not write")


def run(args: argparse.Namespace) -> int:
    path = plot_run(args.workdir, tuple(k for k in args.keys.split(",") if k), args.out, args.overwrite)
    print(path)
    return 0
