"""Sweeps: a grid of RL runs (KL configuration x beta x variant x seed) from one base run config.

A sweep config is a Python file whose `get_config()` returns a ConfigDict (or dict):

    base_config     run config file (relative to the sweep file's directory, the repo root, or absolute)
    base_overrides  ["field=value", ...] applied to every run (like `--config.field=value`)
    kl              KL configurations: preset names of `kljax kl-configs` ("k1-reward", "k2-loss-seq", ...)
                    or dicts of kl fields ({"estimator": "k3", "placement": "loss"})
    beta            [beta, ...]; "none" runs once per variant/seed whatever the betas (beta is unused)
    seed            [seed, ...]
    variants        {name: ["field=value", ...]}, e.g. {"onpolicy": [], "async4": ["rl.async_level=4"]}
    sft             optional `kljax.train.sft.SFTSettings` fields: train the reference model first, into
                    SWEEP_DIR/sft, and start every run from it (`model.source`)

Each grid point runs `kljax.train.trainer.train` into SWEEP_DIR/runs/<name>/ (`run_sweep`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from kljax.api import RLTrainer
from kljax.config.load import CONFIGS_DIR, load_run_config, python_config, read_mapping
from kljax.config.run import RunConfig
from kljax.errors import UserError, read_json
from kljax.rl.kl import KLConfig
from kljax.train.metrics import read_jsonl
from kljax.train.sft import SFTSettings, sft_warm_start
from kljax.train.step import StepSettings
from kljax.util.owned_paths import mark, remove_marked, single_component
from kljax.util.self_command import kljax_argv
from kljax.verdicts.kl import config_name
from kljax.verdicts.presets import PRESETS

REPO_ROOT = CONFIGS_DIR.parent

CURVE_KEYS = ("reward", "accuracy", "kl_seq", "k1", "k2", "k3", "entropy", "grad_norm", "loss", "pg_loss", "kl_loss",
              "nonfinite", "response_length", "clip_fraction", "ratio_mean", "beta", "time_step")
SWEEP_FIELDS = ("base_config", "base_overrides", "kl", "beta", "seed", "variants", "sft")


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One run of the sweep. group: the configuration it belongs to (name without the seed);
    overrides: every "field=value" applied to the base config, in order; unsupported: why the trainer
    rejects it (None when it runs)."""

    name: str
    group: str
    kl_name: str
    kl: dict[str, Any]
    beta: float | None
    variant: str
    seed: int
    overrides: tuple[str, ...]
    unsupported: str | None = None


@dataclasses.dataclass
class Sweep:
    """A loaded sweep config: where its base run config is, and the grid."""

    path: Path | None
    base_config: Path
    spec: dict[str, Any]
    points: list[GridPoint]


def load_sweep(path: str | os.PathLike, extra_overrides: Iterable[str] = ()) -> Sweep:
    """Read a sweep config file and expand its grid (`extra_overrides` go to every run, last)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise UserError(f"sweep config {str(path)!r} does not exist")
    raw = python_config(path) if path.suffix.lower() == ".py" else read_mapping(path)
    return sweep_from_spec(raw, path.parent, extra_overrides, path)


def sweep_from_spec(raw: Any, base_dir: str | os.PathLike = REPO_ROOT / "configs",
                    extra_overrides: Iterable[str] = (), path: Path | None = None) -> Sweep:
    """Expand a sweep spec (ConfigDict or dict, fields as in the module docstring) into grid points."""
    spec = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
    unknown = sorted(set(spec) - set(SWEEP_FIELDS))
    if unknown:
        raise UserError(f"unknown sweep field(s) {unknown}; valid: {list(SWEEP_FIELDS)}")
    if "base_config" not in spec:
        raise UserError("a sweep config needs base_config (the run config file every run starts from)")
    base = _find(spec["base_config"], Path(base_dir))
    common = [*spec.get("base_overrides", []), *(o.lstrip("-").removeprefix("config.") for o in extra_overrides)]
    variants = spec.get("variants") or {"default": []}
    if not isinstance(variants, dict) or not all(isinstance(o, (list, tuple)) for o in variants.values()):
        raise UserError(f"variants={variants!r} must map each variant name to its list of overrides, e.g. "
                         "{'onpolicy': [], 'async4': ['rl.async_level=4']}")
    for variant in variants:
        single_component(str(variant), "sweep variant name")  # it names the run's directory
    points = []
    for kl_item in spec.get("kl") or ["k1-reward"]:
        kl_name, kl = resolve_kl(kl_item)
        if kl.get("placement") != "none" and not list(spec.get("beta") or []):
            raise UserError(f"beta={spec.get('beta')!r} gives no beta for the KL configuration {kl_name}: list at "
                             "least one (beta=[0.05]); a run without KL is kl='none'")
        betas = [None] if kl.get("placement") == "none" else list(spec["beta"])
        for beta in betas:
            for variant, variant_overrides in variants.items():
                for seed in spec.get("seed") or [0]:
                    points.append(_point(base, kl_name, kl, beta, variant, int(seed), common, variant_overrides))
    names = [single_component(p.name, "sweep run name") for p in points]
    if len(set(names)) != len(names):
        raise UserError(f"the grid has duplicate run names: {sorted({n for n in names if names.count(n) > 1})}")
    return Sweep(path, base, spec, points)


def _find(name: str, base_dir: Path) -> Path:
    for candidate in (Path(name), base_dir / name, REPO_ROOT / name, REPO_ROOT / "configs" / name):
        if candidate.is_file():
            return candidate.resolve()
    raise UserError(f"base_config {name!r} not found (looked next to the sweep file, in the repo and configs/)")


def resolve_kl(item: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A preset name of `kljax kl-configs` or a dict of KLConfig fields -> (its config_name, kl fields)."""
    if isinstance(item, str):
        presets = {config_name(c): c for c, _ in PRESETS}
        if item not in presets:
            raise UserError(f"unknown KL preset {item!r}; valid: {sorted(presets)} (or a dict of kl fields)")
        config = presets[item]
    else:
        try:
            config = KLConfig(**{k: v for k, v in dict(item).items() if k != "beta"})
        except TypeError as e:
            raise UserError(f"sweep kl item {item!r}: {e}") from None
    fields = dataclasses.asdict(config)
    kl = {k: fields[k] for k in ("estimator", "placement", "credit", "scope", "off_policy", "truncation")}
    return config_name(config), kl


def _point(base: Path, kl_name: str, kl: dict[str, Any], beta: float | None, variant: str, seed: int,
           common: list[str], variant_overrides: Iterable[str]) -> GridPoint:
    group = f"{kl_name}_{variant}" if beta is None else f"{kl_name}_b{beta:g}_{variant}"
    overrides = [*common, *(f"kl.{k}={v!r}" for k, v in kl.items()), f"kl.beta={0.0 if beta is None else beta!r}",
                 *(o.lstrip("-").removeprefix("config.") for o in variant_overrides), f"seed={seed}"]
    config = _config(base, overrides)  # a typo in the sweep config fails here, before anything runs
    unsupported = None
    try:
        StepSettings(model=None, kl=config.kl)  # the trainer's own check of the KL configuration
    except ValueError as e:
        unsupported = str(e)
    return GridPoint(f"{group}_s{seed}", group, kl_name, kl, beta, variant, seed, tuple(overrides), unsupported)


# ------------------------------------------------------------------------------------------ running


def run_status(run_dir: Path) -> str:
    """"finished" (eval_after.json), "partial" (a complete checkpoint), "broken" (files, no checkpoint), "new"."""
    if (run_dir / "eval_after.json").exists():
        return "finished"
    ckpt = run_dir / "checkpoints"
    if ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir()):
        return "partial"
    return "broken" if run_dir.exists() else "new"


def _prepare(run_dir: Path) -> tuple[bool, bool]:
    """(skip, resume) for a run directory; a run that died before its first checkpoint is removed,
    when the sweep created its directory (`owned_paths.MARKER`, or sweep_run.json of an older kljax):
    anything else there is a UserError naming it, not deleted."""
    status = run_status(run_dir)
    if status == "finished":
        return True, False
    if status == "broken":
        remove_marked(run_dir, "sweep run directory", legacy=("sweep_run.json",))
    if status in ("broken", "new"):
        run_dir.mkdir(parents=True)
        mark(run_dir, "kljax sweep run")
    return False, status == "partial"


def _record_time(run_dir: Path, seconds: float, how: str) -> None:
    path = run_dir / "sweep_run.json"
    info = read_json(path, "sweep run file") if path.exists() else {"wall_s": 0.0, "invocations": []}
    info["wall_s"] += seconds
    info["invocations"].append({"how": how, "wall_s": seconds})
    path.write_text(json.dumps(info, indent=2))


def _config(base: Path, overrides: Iterable[str]) -> RunConfig:
    return load_run_config(base, [f"--config.{o}" for o in overrides])


def _run_in_process(sweep: Sweep, point: GridPoint, run_dir: Path, resume: bool) -> None:
    config = _config(sweep.base_config, point.overrides)
    t0 = time.perf_counter()
    try:
        RLTrainer(config=config, workdir=run_dir, resume=resume, progress=False).train()
    except Exception:  # noqa: BLE001 - one failed run must not end the sweep; its traceback is kept
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(traceback.format_exc())
    _record_time(run_dir, time.perf_counter() - t0, "resumed" if resume else "ran")


def _command(sweep: Sweep, point: GridPoint, run_dir: Path, resume: bool) -> list[str]:
    cmd = kljax_argv(["train", "--config", str(sweep.base_config), "--workdir", str(run_dir), "--no-progress",
                      *(f"--config.{o}" for o in point.overrides)])  # nothing imported from the working directory
    return [*cmd, "--resume"] if resume else cmd


def run_sweep(sweep: Sweep, out_dir: str | os.PathLike, parallel: int = 0, progress: bool = True,
              log: Any = print) -> dict[str, str]:
    """Run every supported grid point not yet finished; returns {run name: what happened}
    ("skipped", "ran", "resumed", "failed", "unsupported"). parallel=0 runs in this process;
    N >= 1 runs N `python -m kljax train` subprocesses at a time (logs in RUN_DIR/train.log).

    A run's directory is SWEEP_DIR/runs/<name>, name = "<kl>_b<beta>_<variant>_s<seed>"
    ("none_<variant>_s<seed>" without KL). Resumable: a run with eval_after.json is finished and skipped; one
    with a checkpoint resumes with --resume; one without is started over. A configuration the trainer's
    validation rejects is listed as unsupported (with the reason) and not run. After every run,
    SWEEP_DIR/summary.json collects each run's curves (metrics.jsonl) and evaluations (eval_before/after.json)
    for `kljax report`."""
    out_dir = Path(out_dir).absolute()  # the subprocesses run in another directory
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    sweep = _with_sft(sweep, out_dir, progress, log)
    (out_dir / "sweep.json").write_text(json.dumps(
        {"path": str(sweep.path), "base_config": str(sweep.base_config), "spec": sweep.spec,
         "points": [dataclasses.asdict(p) for p in sweep.points]}, indent=2, default=str))
    actions: dict[str, str] = {}
    todo: list[tuple[GridPoint, bool]] = []
    for p in sweep.points:
        run_dir = out_dir / "runs" / p.name
        if p.unsupported:
            actions[p.name] = "unsupported"
            continue
        skip, resume = _prepare(run_dir)
        if skip:
            actions[p.name] = "skipped"
        else:
            todo.append((p, resume))
    log(f"sweep: {len(sweep.points)} runs: {len(todo)} to run, {sum(a == 'skipped' for a in actions.values())} "
        f"finished, {sum(a == 'unsupported' for a in actions.values())} not supported by the trainer")
    bar = tqdm(total=len(todo), disable=not progress, desc="kljax sweep", unit="run", dynamic_ncols=True)
    running: list[tuple[GridPoint, bool, subprocess.Popen, Any, float]] = []
    queue = list(todo)
    while queue or running:
        if parallel < 1:
            p, resume = queue.pop(0)
            bar.set_postfix_str(p.name)
            _run_in_process(sweep, p, out_dir / "runs" / p.name, resume)
            actions[p.name] = _outcome(out_dir / "runs" / p.name, resume)
            bar.update(1)
            write_summary(sweep, out_dir)
            continue
        while queue and len(running) < parallel:
            p, resume = queue.pop(0)
            run_dir = out_dir / "runs" / p.name
            run_dir.mkdir(parents=True, exist_ok=True)
            logf = open(run_dir / "train.log", "a")  # noqa: SIM115 - closed when the process ends
            proc = subprocess.Popen(_command(sweep, p, run_dir, resume), stdout=logf, stderr=subprocess.STDOUT,
                                    cwd=str(REPO_ROOT))
            running.append((p, resume, proc, logf, time.perf_counter()))
        time.sleep(0.2)
        for item in [r for r in running if r[2].poll() is not None]:
            p, resume, proc, logf, t0 = item
            running.remove(item)
            logf.close()
            run_dir = out_dir / "runs" / p.name
            if proc.returncode:
                (run_dir / "error.txt").write_text(f"exit status {proc.returncode}; see train.log\n")
            _record_time(run_dir, time.perf_counter() - t0, "resumed" if resume else "ran")
            actions[p.name] = _outcome(run_dir, resume)
            bar.update(1)
            write_summary(sweep, out_dir)
    bar.close()
    write_summary(sweep, out_dir)
    return actions


def _outcome(run_dir: Path, resume: bool) -> str:
    if run_status(run_dir) != "finished":
        return "failed"
    (run_dir / "error.txt").unlink(missing_ok=True)
    return "resumed" if resume else "ran"


def _with_sft(sweep: Sweep, out_dir: Path, progress: bool, log: Any) -> Sweep:
    """Train the sweep's reference model first (once; reused when SWEEP_DIR/sft/sft.json exists) and
    point every run's model.source at it."""
    if not sweep.spec.get("sft"):
        return sweep
    sft_dir = (out_dir / "sft").resolve()
    log(f"sweep: supervised warm start of the reference model in {sft_dir}")
    summary = sft_warm_start(SFTSettings.from_mapping(sweep.spec["sft"]), sft_dir, progress=progress)
    log(f"sweep: reference model greedy accuracy {summary['greedy_accuracy']}")
    points = [dataclasses.replace(p, overrides=(*p.overrides, f"model.source={str(sft_dir)!r}"))
              for p in sweep.points]
    return dataclasses.replace(sweep, points=points)


# ------------------------------------------------------------------------------------------ summary


def _number(v: Any) -> float:
    try:
        return float(v)  # non-finite values are stored as the strings "nan", "inf", "-inf"
    except (TypeError, ValueError):
        return float("nan")


def run_record(point: GridPoint, run_dir: Path) -> dict[str, Any]:
    """One run's entry of summary.json: grid coordinates, status, curves and evaluations."""
    record: dict[str, Any] = {**dataclasses.asdict(point), "overrides": list(point.overrides),
                              "status": "unsupported" if point.unsupported else run_status(run_dir)}
    rows = read_jsonl(run_dir / "metrics.jsonl") if run_dir.exists() else []
    record["steps"] = [int(r["step"]) for r in rows]
    record["curves"] = {k: [_number(r.get(k)) for r in rows] for k in CURVE_KEYS if any(k in r for r in rows)}
    for name in ("eval_before", "eval_after", "sweep_run"):
        path = run_dir / f"{name}.json"
        record[name] = read_json(path, "sweep run file") if path.exists() else None  # a cut file: named
    if (run_dir / "error.txt").exists():
        record["error"] = (run_dir / "error.txt").read_text()[-2000:]
    return record


def write_summary(sweep: Sweep, out_dir: str | os.PathLike) -> Path:
    """Write SWEEP_DIR/summary.json (atomically) from the run directories as they are now."""
    out_dir = Path(out_dir)
    sft = None
    if (out_dir / "sft" / "sft.json").exists():
        sft = read_json(out_dir / "sft" / "sft.json", "sweep file")
    summary = {
        "sweep_config": str(sweep.path) if sweep.path else None, "base_config": str(sweep.base_config),
        "spec": sweep.spec, "sft": sft,
        "runs": [run_record(p, out_dir / "runs" / p.name) for p in sweep.points],
    }
    tmp = out_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, default=str))
    tmp.replace(out_dir / "summary.json")
    return out_dir / "summary.json"
