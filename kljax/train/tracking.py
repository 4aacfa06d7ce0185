"""Experiment trackers a run reports its metrics rows to (`config.logging.report_to`), beside
metrics.jsonl, which is always written and is the record.

    logging.report_to = "tensorboard,wandb,mlflow"   (a comma list; "none" or "" for none)
    logging.project   = "kljax"                      (the W&B project, the MLflow experiment)
    logging.run_name  = ""                           ("" = the workdir's name)

tensorboard  TensorBoard event files in WORKDIR/tb (tensorboardX; without it, one note and no events).
wandb        Weights & Biases (the `track` extra); files under WORKDIR/wandb. WANDB_MODE=offline works
             without an account (`wandb sync` uploads later); WANDB_* variables apply as usual.
mlflow       MLflow (the `track` extra, mlflow-skinny suffices); the tracking URI is MLflow's own
             (MLFLOW_TRACKING_URI, e.g. a server, or file:DIR with MLFLOW_ALLOW_FILE_STORE=true).
             Metric names are the run's own, "/" included (rewards/length/mean), as W&B's and TensorBoard's;
             characters MLflow refuses become "_" (transformers' MLflowCallback does the same).

A W&B or MLflow tracker that is not installed fails the run before anything loads, in one line naming
the extra to install (`check_installed`). The W&B run id and MLflow run id are kept in
WORKDIR/tracking.json, so a resumed run continues the same tracked run. Only process 0 reports.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from kljax.config.run import RunConfig
from kljax.config.sections import TRACKERS, LoggingSection
from kljax.errors import UserError

__all__ = ["TRACKERS", "check_installed", "open_trackers"]
PACKAGES = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow"}
INSTALL = {"wandb": "pip install 'kljax[track]' (or pip install wandb)",
           "mlflow": "pip install 'kljax[track]' (or pip install mlflow-skinny)"}
IDS_FILE = "tracking.json"


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a None entry in sys.modules (blocked on purpose)
        return False


def check_installed(logging: LoggingSection) -> tuple[str, ...]:
    """The trackers logging.report_to names; a W&B or MLflow one that is not installed, or MLflow
    without a tracking store it can write, is a UserError saying what to do, before anything loads.
    (TensorBoard is optional: `open_trackers` notes its absence.)"""
    names = logging.reporters
    for name in names:
        if name in INSTALL and not _installed(PACKAGES[name]):
            raise UserError(f"logging.report_to names {name!r}, which is not installed: {INSTALL[name]}, "
                            "or leave it out of logging.report_to")
    if "mlflow" in names:
        _check_mlflow_store(os.environ.get("MLFLOW_TRACKING_URI", ""))
    return names


def _check_mlflow_store(uri: str) -> None:
    todo = ("set MLFLOW_TRACKING_URI to a tracking server (http://HOST:PORT) or a local store (file:./mlruns with "
            "MLFLOW_ALLOW_FILE_STORE=true), or leave mlflow out of logging.report_to")
    if not uri:
        raise UserError(f"logging.report_to names 'mlflow' but MLFLOW_TRACKING_URI is not set (MLflow would make a "
                        f"database in the working directory); {todo}")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else "file"
    if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true", "yes"):
        raise UserError(f"MLFLOW_TRACKING_URI={uri!r} is a file store, which MLflow refuses unless "
                        f"MLFLOW_ALLOW_FILE_STORE=true; {todo}")
    if scheme in ("sqlite", "postgresql", "mysql", "mssql") and not _installed("sqlalchemy"):
        raise UserError(f"MLFLOW_TRACKING_URI={uri!r} is a database store, which needs SQLAlchemy (pip install "
                        f"mlflow instead of mlflow-skinny); {todo}")


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, workdir: Path) -> None:
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(workdir / "tb"))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    name = "wandb"

    def __init__(self, workdir: Path, project: str, name: str, config: dict[str, Any], run_id: str | None) -> None:
        import wandb

        self._run = wandb.init(project=project, name=name, config=config, dir=str(workdir), id=run_id,
                               resume="allow" if run_id else None)
        self.run_id = self._run.id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, project: str, name: str, config: dict[str, Any], run_id: str | None) -> None:
        import mlflow

        self._mlflow = mlflow
        if run_id is None:
            mlflow.set_experiment(project)
            self._run = mlflow.start_run(run_name=name)
            params = sorted(_flat_params(config).items())
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
                mlflow.log_params(dict(params[i: i + 100]))
        else:
            self._run = mlflow.start_run(run_id=run_id)
        self.run_id = self._run.info.run_id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        # NaN/inf are left out (metrics.jsonl's null); names as in `_mlflow_key`
        self._mlflow.log_metrics({_mlflow_key(k): v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()


def _mlflow_key(key: str) -> str:
    """An MLflow metric name: the run's own (W&B's and TensorBoard's), with anything but ASCII
    alphanumerics, _ - . space : and / made _ (the characters MLflow accepts in a name). kljax's names
    never hold both "a" and "a/b", which a file store could not."""
    return "".join(c if c.isascii() and c.isalnum() or c in "_-. :/" else "_" for c in key)


def _flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out.update(_flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:500]  # MLflow's limit on a parameter value
    return out


def open_trackers(config: RunConfig, workdir: str | Path, resume: bool) -> list[Tracker]:
    """The trackers of `config.logging` for the run in `workdir` (process 0 only: the caller checks);
    a resumed run reopens the W&B / MLflow runs recorded in WORKDIR/tracking.json."""
    workdir = Path(workdir)
    names = check_installed(config.logging)
    project = config.logging.project or "kljax"
    name = config.logging.run_name or workdir.resolve().name
    ids_path = workdir / IDS_FILE
    ids = json.loads(ids_path.read_text()) if resume and ids_path.is_file() else {}
    values = config.to_dict()
    trackers: list[Tracker] = []
    for tracker in names:
        if tracker == "tensorboard":
            if _installed(PACKAGES["tensorboard"]):
                trackers.append(TensorBoardTracker(workdir))
            else:
                print("kljax train: note: tensorboardX is not installed, so no TensorBoard events are written "
                      "(pip install tensorboardX, or logging.report_to=none)", flush=True)
        elif tracker == "wandb":
            trackers.append(WandbTracker(workdir, project, name, values, ids.get("wandb")))
        else:
            try:
                trackers.append(MlflowTracker(project, name, values, ids.get("mlflow")))
            except Exception as e:  # noqa: BLE001 - MLflow's own errors of its store: one line naming it
                uri = os.environ.get("MLFLOW_TRACKING_URI", "")
                raise UserError(f"MLflow could not start a run in MLFLOW_TRACKING_URI={uri!r}: "
                                f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e
    new_ids = {t.name: t.run_id for t in trackers if hasattr(t, "run_id")}
    if new_ids:
        ids_path.write_text(json.dumps({**ids, **new_ids}, indent=2) + "\n")
    return trackers
