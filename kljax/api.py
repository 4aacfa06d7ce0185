"""Train from Python, the way TRL's `GRPOTrainer` is used; `kljax train` goes through the same class.

    import kljax

    trainer = kljax.RLTrainer(
        model="default",                        # "tiny", "default", an HF directory, or a kljax run directory
        reward_funcs=[my_reward, "rewards.py:format_ok", "exact_match"],   # callables, specs, built-ins
        reward_weights=[1.0, 0.5, 1.0],
        train_dataset=dataset,                  # datasets.Dataset / DatasetDict, a path, or a list of dicts
        eval_dataset=None,                      # its own split; default: the data's test/validation split
        config={"steps": 50, "kl": {"beta": 0.05}},   # a ConfigDict, a dict of fields, or a config file
        workdir="runs/mine",
    )
    result = trainer.train()                    # TrainResult: the trained policy, its metrics, evaluations
    trainer.save_pretrained("my-model")         # a Hugging Face checkpoint with its tokenizer

Datasets in TRL's layouts: "standard" (a `prompt` text column) or "conversational" (`prompt` is a
list of chat messages), told apart from the data; every other column goes to the reward functions.
A dataset object or list is saved under WORKDIR/data (so a run resumes, and `kljax eval` reads it,
without the Python objects); a path is read where it is. Reward functions follow TRL's convention
(`kljax.tasks.reward_functions`); with reward.timeout_s they run in worker processes, functions
defined in a script or notebook included (sent by value with cloudpickle).

Config: `config` (default: configs/tiny.py for model="tiny", else configs/default.py) with a
dict's fields or `overrides` ("--config.a.b=value" strings) set over it. When the file's task is a
built-in one and the run's data is the user's, the task section restarts from the run defaults
(configs/kljax_base.py) but for the fields set explicitly, so a built-in task's prompt settings
(system prompt, answer-format line, evaluation splits) never leak into the user's data.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from kljax.errors import UserError

DATA_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
ModelSpec = str | os.PathLike
RewardSpec = str | Callable[..., Any]


@dataclasses.dataclass
class TrainResult:
    """What `RLTrainer.train` returns.

    policy: the trained policy (`kljax.train.policy.Policy`: model config, params, tokenizer, stop and
    pad ids); metrics: one dict per step (metrics.jsonl); eval_before / eval_after: {split: {"accuracy",
    "reward", "n", ...}}; workdir: where the run's files are; stopped_at: the last step when
    `stop_after` ended it early (None: finished); exact: a toy task's exact gap before/after, or None.
    """

    policy: Any
    metrics: list[dict[str, Any]]
    eval_before: dict[str, Any]
    eval_after: dict[str, Any]
    workdir: Path
    stopped_at: int | None = None
    exact: dict[str, float] | None = None

    @property
    def params(self) -> Any:
        return self.policy.params


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_config(source: Any = None, overrides: Sequence[str] | Mapping[str, Any] = (),
               model: ModelSpec | None = None) -> tuple[ml_collections.ConfigDict, set[str]]:
    """The run config and the dotted names of the fields set explicitly: `source` (None: the default
    file for `model`; a file; a ConfigDict; a dict of fields over the default file) with `overrides`
    ("--config.a.b=value" strings or a dict of fields) set over it."""
    from kljax.train.config import DEFAULT_CONFIG, apply_overrides, load_config
    from kljax.train.config_files import config_from_mapping

    fields: dict[str, Any] = {}
    if isinstance(source, Mapping) and not isinstance(source, ml_collections.ConfigDict):
        fields, source = _flatten(source), None
    if isinstance(source, ml_collections.ConfigDict):
        config = ml_collections.ConfigDict(source.to_dict())
    else:
        if source is None and str(model) == "tiny":
            source = DEFAULT_CONFIG.parent / "tiny.py"
        config = load_config(source)
        if not isinstance(config, ml_collections.ConfigDict):
            config = apply_overrides(config, [])  # names what it is instead
    builtin_task = str(config.task.name)
    explicit = set(fields)
    if fields:
        config = config_from_mapping(fields, config, "RLTrainer(config=...)")
    if isinstance(overrides, Mapping):
        flat = _flatten(overrides)
        config, explicit = config_from_mapping(flat, config, "RLTrainer overrides"), explicit | set(flat)
    elif overrides:
        config = apply_overrides(config, list(overrides))
        explicit |= {o.lstrip("-").partition("=")[0][len("config."):] for o in overrides}
    _restart_task_section(config, builtin_task, explicit)
    return config, explicit


def _restart_task_section(config: ml_collections.ConfigDict, builtin_task: str, explicit: set[str]) -> None:
    """Reset the task fields a built-in task's config set (and the user did not) when the run's data is the
    user's, and rl.max_prompt_len, the length of that task's prompts (configs/tiny.py: 4), so that
    `auto_prompt_len` fits it to the user's data."""
    from kljax.tasks.files import FORMATS
    from kljax.train.config_checks import default_config

    defaults = default_config()
    if builtin_task in FORMATS or str(config.task.name) not in FORMATS or defaults is None:
        return
    reset = []
    with config.unlocked():
        for key, value in defaults.task.items():
            if f"task.{key}" not in explicit and key in config.task and config.task[key] != value:
                reset.append(f"{key}={config.task[key]!r}")
                config.task[key] = value
        if "rl.max_prompt_len" not in explicit and config.rl.max_prompt_len != defaults.rl.max_prompt_len:
            reset.append(f"rl.max_prompt_len={config.rl.max_prompt_len!r}")
            config.rl.max_prompt_len = defaults.rl.max_prompt_len
    if reset:
        print(f"kljax train: task {config.task.name!r} is your data: the config's settings for task "
              f"{builtin_task!r} ({', '.join(reset)}) are left at their defaults; set them to use them",
              file=sys.stderr, flush=True)


def reward_spec_of(fn: RewardSpec) -> str:
    """How config.json records a reward function: its spec, or module:name for a function object."""
    if isinstance(fn, str):
        return fn
    from kljax.tasks.reward_functions import function_name

    return f"{getattr(fn, '__module__', None) or '?'}:{function_name(fn)}"


def _dataset_fields(train: Any, eval_: Any, workdir: Path, resume: bool) -> dict[str, Any]:
    """The task fields for the datasets (a path read where it is; anything else saved under workdir/data)."""
    if train is None:
        if eval_ is not None:
            raise UserError("RLTrainer: eval_dataset needs a train_dataset")
        return {}
    paths = [d for d in (train, eval_) if isinstance(d, (str, os.PathLike))]
    if len(paths) == (1 if eval_ is None else 2):
        kinds = [_path_kind(Path(p)) for p in paths]
        if eval_ is None:
            return {"task.name": kinds[0], "task.path": str(train)}
        if kinds[0] == kinds[1] != "hf":
            return {"task.name": kinds[0], "task.path": f"train={train},test={eval_}"}
    target = workdir / "data"
    if not (resume and target.is_dir()):  # a resumed run reads the copy it started with
        _as_dataset(train, eval_).save_to_disk(str(target))
    return {"task.name": "hf", "task.path": str(target)}


def _path_kind(path: Path) -> str:
    if path.is_dir():
        return "hf"
    kind = DATA_SUFFIXES.get(path.suffix.lower())
    if kind is None or not path.is_file():
        what = "does not exist" if not path.exists() else f"is not a {', '.join(DATA_SUFFIXES)} file nor a directory"
        raise UserError(f"RLTrainer: dataset path {str(path)!r} {what}")
    return kind


def _as_dataset(train: Any, eval_: Any) -> Any:
    """A datasets.Dataset (no split: task.eval_fraction holds rows out) or a DatasetDict with train (+ test)."""
    import datasets

    def one(data: Any, what: str) -> Any:
        if isinstance(data, (str, os.PathLike)):
            kind = _path_kind(Path(data))
            if kind == "hf":
                loaded = datasets.load_from_disk(str(data))
                return loaded["train"] if isinstance(loaded, datasets.DatasetDict) else loaded
            return datasets.load_dataset({"jsonl": "json"}.get(kind, kind), data_files=str(data), split="train")
        if isinstance(data, datasets.Dataset):
            return data
        if isinstance(data, Sequence) and data and all(isinstance(r, Mapping) for r in data):
            try:
                return datasets.Dataset.from_list([dict(r) for r in data])
            except Exception as e:  # noqa: BLE001 - pyarrow's many type errors
                raise UserError(f"RLTrainer: {what} rows cannot form one table: {type(e).__name__}: {e}") from None
        raise UserError(f"RLTrainer: {what} is a {type(data).__name__}; give a datasets.Dataset or DatasetDict, a "
                        "path (file or directory), or a non-empty list of dicts")

    if isinstance(train, datasets.DatasetDict):
        if "train" not in train:
            raise UserError(f"RLTrainer: train_dataset has no 'train' split; splits: {sorted(train)}")
        if eval_ is None:
            return train
        return datasets.DatasetDict({"train": train["train"], "test": one(eval_, "eval_dataset")})
    train = one(train, "train_dataset")
    if eval_ is None:
        return train
    return datasets.DatasetDict({"train": train, "test": one(eval_, "eval_dataset")})


def _model_source(model: ModelSpec, workdir: Path, resume: bool) -> str:
    """config.model.source for `model`: a kljax run directory is exported to workdir/init_model first."""
    from kljax.cli.export import export_run, is_run_workdir

    text = str(model)
    if text in ("tiny", "default", "tabular"):
        return text
    path = Path(text).expanduser()
    if not path.is_dir():
        raise UserError(f"RLTrainer: model={text!r} is neither 'tiny', 'default' nor a directory (an HF checkpoint "
                        "or a kljax run)")
    if is_run_workdir(path):
        target = workdir / "init_model"
        if not (resume and target.is_dir()):
            print(f"kljax train: starting from run {path}: its latest checkpoint exported to {target}", flush=True)
            export_run(path, target, overwrite=True)
        return str(target)
    return str(path)


class _Known(Exception):
    """Raised by `_model_and_tokenizer`'s hook: the model config and tokenizer are known, no weight is needed."""


def _model_and_tokenizer(config: ml_collections.ConfigDict, task: Any) -> tuple[Any, Any]:
    """The model config and tokenizer a run would load (no weight read, nothing placed on a device)."""
    from kljax.train.policy import load_policy

    found: list[Any] = []

    def stop(model: Any, tokenizer: Any) -> None:
        found.extend((model, tokenizer))
        raise _Known

    try:
        load_policy(config.model, None, task=task, before_weights=stop)
    except _Known:
        pass
    return found[0], found[1]


def auto_prompt_len(config: ml_collections.ConfigDict, explicit: set[str]) -> int | None:
    """rl.max_prompt_len for the user's data when it is left at the run default (not set by the user nor
    by the config file): the longest prompt after templating, at most the model's context minus
    rl.max_new_tokens; None when it does not apply (a built-in task, a value chosen) or cannot be told
    (a prompt the tokenizer cannot encode: the trainer's own check names it)."""
    from kljax.tasks.files import FORMATS
    from kljax.tasks.from_config import task_from_config
    from kljax.tasks.prompting import prompt_texts
    from kljax.train.config_checks import default_config

    defaults = default_config()
    if (str(config.task.name) not in FORMATS or "rl.max_prompt_len" in explicit or defaults is None
            or config.rl.max_prompt_len != defaults.rl.max_prompt_len):
        return None
    task = task_from_config(config)
    model, tokenizer = _model_and_tokenizer(config, task)
    fmt = str(config.task.prompt_format)
    try:
        longest = max(len(tokenizer.encode(text, add_special_tokens=False)) for split in task.splits
                      for text in prompt_texts(task.examples(split), task, tokenizer, fmt))
    except ValueError:
        return None
    room = int(getattr(model, "max_position_embeddings", 0) or 0) - int(config.rl.max_new_tokens)
    return max(1, min(longest, room)) if room >= 1 else longest


class RLTrainer:
    """KL-regularized RL fine-tuning from Python (see the module docstring).

    resume: False (new run; a workdir holding one is an error), True/"latest", "auto" or "strict"
    (`kljax.train.trainer.train`); progress: show a progress bar (else one line per step);
    overrides: "--config.a.b=value" strings or a dict of fields, set last (the CLI's flags).
    """

    def __init__(self, model: ModelSpec | None = None, reward_funcs: RewardSpec | Sequence[RewardSpec] | None = None,
                 reward_weights: Sequence[float] | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 config: Any = None, workdir: str | os.PathLike | None = None, *, resume: bool | str = False,
                 progress: bool = True, overrides: Sequence[str] | Mapping[str, Any] = ()):
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="kljax-run-"))
        self.resume, self.progress = resume, progress
        config, explicit = run_config(config, overrides, model)
        fields: dict[str, Any] = {}
        if model is not None:
            fields["model.source"] = _model_source(model, self.workdir, bool(resume))
        if callable(reward_funcs) or isinstance(reward_funcs, str):
            reward_funcs = [reward_funcs]
        self.reward_funcs = list(reward_funcs) if reward_funcs is not None else None
        if self.reward_funcs is not None:
            fields["reward.functions"] = ",".join(reward_spec_of(f) for f in self.reward_funcs)
        if reward_weights is not None:
            fields["reward.weights"] = [float(w) for w in reward_weights]
        data = _dataset_fields(train_dataset, eval_dataset, self.workdir, bool(resume))
        if data:
            builtin_task = str(config.task.name)
            fields.update(data)
            explicit |= set(data)
        from kljax.train.config import validate
        from kljax.train.config_files import config_from_mapping

        if fields:
            config = config_from_mapping(fields, config, "RLTrainer")
        if data:
            _restart_task_section(config, builtin_task, explicit)
        validate(config)
        self.config, self.explicit = config, explicit
        self.result: TrainResult | None = None

    def train(self, stop_after: int | None = None) -> TrainResult:
        """Run (or resume) training; the trained policy, its metrics and the evaluations before/after."""
        from kljax.train import trainer
        from kljax.train.metrics import read_jsonl

        fitted = auto_prompt_len(self.config, self.explicit)
        if fitted is not None and fitted != self.config.rl.max_prompt_len:
            print(f"kljax train: rl.max_prompt_len={fitted}: the longest prompt of the data after templating "
                  f"(capped by the model's context; set rl.max_prompt_len to choose)", flush=True)
            with self.config.unlocked():
                self.config.rl.max_prompt_len = fitted
        summary = trainer.train(self.config, self.workdir, resume=self.resume, progress=self.progress,
                                stop_after=stop_after, reward_funcs=self.reward_funcs)
        policy = dataclasses.replace(summary["policy"], params=summary["params"])
        metrics_path = self.workdir / "metrics.jsonl"
        self.result = TrainResult(policy, read_jsonl(metrics_path) if metrics_path.exists() else [],
                                  summary["before"], summary["after"], self.workdir, summary.get("stopped_at"),
                                  summary.get("exact"))
        return self.result

    def save_pretrained(self, out_dir: str | os.PathLike, *, overwrite: bool = False, step: int | None = None,
                        dtype: str | None = None, format: str = "merged") -> Path:  # noqa: A002 - export's name
        """Write the trained policy (the run's latest checkpoint, or `step`) as a Hugging Face checkpoint
        with its tokenizer (`kljax export`); the directory written. With LoRA adapters, `format="peft"`
        writes a PEFT adapter directory for the base instead of the merged model."""
        from kljax.cli.export import export_run, is_run_workdir

        if format not in ("merged", "peft"):
            raise UserError(f"RLTrainer.save_pretrained: format={format!r} is not one of 'merged', 'peft'")
        if not is_run_workdir(self.workdir):
            raise UserError(f"RLTrainer.save_pretrained: {self.workdir} holds no trained run yet; call train() first")
        written, _ = export_run(self.workdir, out_dir, step=step, dtype=dtype, overwrite=overwrite, fmt=format)
        return written
