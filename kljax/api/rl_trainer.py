"""Train from Python, the way TRL's `GRPOTrainer` is used; `kljax train` goes through the same class.

    import kljax

    trainer = kljax.RLTrainer(
        model="default",                        # "tiny", "default", an HF directory, or a kljax run directory
        reward_funcs=[my_reward, "rewards.py:format_ok", "exact_match"],   # callables, specs, built-ins
        reward_weights=[1.0, 0.5, 1.0],
        train_dataset=dataset,                  # datasets.Dataset / DatasetDict, a path, or a list of dicts
        config={"steps": 50, "kl": {"beta": 0.05}},   # a dict of fields, a config file, or a RunConfig
        workdir="runs/mine",
    )
    # or a TRL job as it is: args=GRPOConfig(...) / RLOOConfig(...), callbacks=[TrainerCallback, ...],
    # processing_class=tokenizer, peft_config=LoraConfig(...) (`kljax.api.trl_args`)
    result = trainer.train()                    # TrainResult: the trained policy, its metrics, evaluations
    trainer.save_pretrained("my-model")         # a Hugging Face checkpoint with its tokenizer

This is the edge: every argument is checked here and turned into one `RunConfig` and one list of
reward functions; the constructor writes nothing. `train()` records a dataset object under
WORKDIR/data (so a run resumes, and `kljax eval` reads it, without the Python objects) once the
workdir checks have passed, then runs the core inside the fault boundary (`kljax.boundary.run`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kljax.api.data import DataSource, data_source
from kljax.api.inputs import (
    check_model_source,
    check_overrides,
    check_resume,
    check_reward_funcs,
    check_weights,
    check_workdir,
    model_source,
    new_run_dir,
)
from kljax.api.trl_args import lora_fields
from kljax.api.trl_callbacks import TrainerCallbacks
from kljax.api.trl_inputs import check_not_taken, template_fields, trl_settings, trl_weights
from kljax.boundary.reward_guard import in_process_guard
from kljax.boundary.run import guarded_run
from kljax.config.load import CONFIGS_DIR, load_run_config, with_fields
from kljax.config.run import RunConfig
from kljax.errors import UserError
from kljax.models.lora import check_rank
from kljax.parallel import distributed
from kljax.tasks.from_config import task_of
from kljax.tasks.reward_functions import function_name
from kljax.train import trainer
from kljax.train.export import EXPORT_DTYPES, EXPORT_FORMATS, export_run, is_run_workdir
from kljax.train.metrics import read_jsonl
from kljax.train.policy import Policy, model_and_tokenizer
from kljax.train.reward_set import reward_functions
from kljax.train.run_build import check_something_scores
from kljax.train.tracking import check_installed
from kljax.train.user_data import fit_prompt_len, restart_task_for_user_data


@dataclasses.dataclass
class TrainResult:
    """What `RLTrainer.train` returns.

    policy: the trained policy (model config, params, tokenizer, stop and pad ids); metrics: one dict
    per step (metrics.jsonl); eval_before / eval_after: {split: {...}} (`kljax.train.evaluate_loop`);
    workdir: where the run's files are; stopped_at: the last step when `stop_after` ended it early
    (None: finished); exact: a toy task's exact gap before/after, or None.
    """

    policy: Policy
    metrics: list[dict[str, Any]]
    eval_before: dict[str, Any]
    eval_after: dict[str, Any]
    workdir: Path
    stopped_at: int | None = None
    exact: dict[str, float] | None = None

    @property
    def params(self) -> Any:
        return self.policy.params


def reward_spec_of(fn: Any) -> str:
    """How config.json records a reward function: its spec, or module:name for a function object."""
    if isinstance(fn, str):
        return fn
    return f"{getattr(fn, '__module__', None) or '?'}:{function_name(fn)}"


def run_config(source: Any = None, overrides: Sequence[str] | Mapping[str, Any] = (), model: Any = None,
               fields: Mapping[str, Any] | None = None) -> tuple[RunConfig, set[str]]:
    """(the run config, the dotted names of the fields set explicitly): `source` (None: the defaults, or
    configs/tiny.py for model="tiny"; a file; a dict of fields over those; a RunConfig), then `fields`
    (the trainer's arguments: model, rewards, data), then `overrides` ("--config.a.b=value" strings or a
    dict). When the data is the user's, a built-in task's settings of the file are dropped
    (`restart_task_for_user_data`)."""
    base = RunConfig()
    explicit: set[str] = set()
    tiny = CONFIGS_DIR / "tiny.py"
    if (source is None or isinstance(source, Mapping)) and str(model) == "tiny" and tiny.is_file():
        base = load_run_config(tiny)
    if isinstance(source, Mapping):
        explicit |= set(_flat(source))
        config = with_fields(base, source, "RLTrainer(config=...)")
    else:
        config = load_run_config(source, base=base)
    builtin_task = config.task.name
    if fields:
        explicit |= set(fields)
        config = with_fields(config, fields, "RLTrainer")
    if isinstance(overrides, Mapping):
        explicit |= set(_flat(overrides))
        config = with_fields(config, overrides, "RLTrainer(overrides=...)")
    else:
        config = load_run_config(None, check_overrides(overrides), base=config)
        explicit |= {o.lstrip("-").partition("=")[0][len("config."):] for o in overrides}
    return restart_task_for_user_data(config, builtin_task, explicit), explicit


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class RLTrainer:
    """KL-regularized RL fine-tuning from Python (see the module docstring).

    resume: False (new run; a workdir holding one is an error), True/"latest", "auto" or "strict"
    (`kljax.train.trainer.train`); progress: show a progress bar (else one line per step);
    overrides: "--config.a.b=value" strings or a dict of fields, set last (the CLI's flags).

    TRL's arguments: args (or config) a `GRPOConfig` / `RLOOConfig` or a dict of their fields,
    translated by `kljax.api.trl_args` (its output_dir is the workdir unless one is given);
    callbacks: `transformers.TrainerCallback`s (`kljax.api.trl_callbacks`); processing_class: a
    tokenizer whose chat template prompts the data (or chat_template: the template itself);
    peft_config: a `peft.LoraConfig`, trained as kljax's LoRA adapters.
    """

    def __init__(self, model: str | os.PathLike | None = None, reward_funcs: Any = None,
                 reward_weights: Sequence[float] | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 config: Any = None, workdir: str | os.PathLike | None = None, *, args: Any = None,
                 callbacks: Sequence[Any] | None = None, processing_class: Any = None, chat_template: str | None = None,
                 peft_config: Any = None, reward_processing_classes: Any = None,
                 optimizers: tuple[Any, Any] = (None, None), resume: bool | str = False, progress: bool = True,
                 overrides: Sequence[str] | Mapping[str, Any] = ()):
        check_not_taken(reward_processing_classes, optimizers)
        self._data: DataSource | None = data_source(train_dataset, eval_dataset)
        trl_args = args if args is not None else config  # what callbacks get as `args` when it is TRL's
        self.trl, config, workdir = trl_settings(args, config, workdir, self._data)
        self.workdir = check_workdir(workdir) if workdir is not None else new_run_dir()
        self.resume, self.progress = check_resume(resume), bool(progress)
        if config is not None and not isinstance(config, (str, os.PathLike, Mapping, RunConfig)):
            raise UserError(f"RLTrainer: config={config!r} is a {type(config).__name__}; give a dict of fields, a "
                            "config file path (.py, .yaml, .json), a kljax RunConfig, or TRL's GRPOConfig as args=")
        self.reward_funcs = check_reward_funcs(reward_funcs)
        fields: dict[str, Any] = {}
        self._model = model_source(model, self.workdir)
        if self._model is not None:
            fields["model.source"] = self._model.source
        if self.reward_funcs is not None:
            fields["reward.functions"] = [reward_spec_of(f) for f in self.reward_funcs]
        reward_weights = trl_weights(config, self.trl, reward_weights)
        if reward_weights is not None:
            fields["reward.weights"] = check_weights(reward_weights, self.reward_funcs)
        self.notes: list[str] = []
        if peft_config is not None:
            lora, self.notes = lora_fields(peft_config)
            fields.update(lora)
        fields.update(template_fields(processing_class, chat_template))
        if self._data is not None:
            fields.update(self._data.fields(self.workdir))
        config, explicit = run_config(config, overrides, model, fields)
        if self.reward_funcs is None and config.reward.timeout_s is None:  # a recorded spec that cannot load: now
            try:
                reward_functions(config.reward)
            except ValueError as e:
                raise UserError(f"RLTrainer: {e}") from None
        if self._data is not None and self._data.dataset is not None:  # the rows are known: say it now
            check_something_scores(config)
        if self._model is None or self._model.run is None:
            check_model_source(config.model.source)
        check_installed(config.logging)  # a W&B / MLflow tracker that is not installed: one line, up front
        self.config, self.explicit = config, explicit
        self.result: TrainResult | None = None
        self.callbacks = TrainerCallbacks(callbacks, trl_args if self.trl else None) if callbacks is not None else None
        if self.callbacks is not None:
            self.callbacks.init_end()

    def train(self, stop_after: int | None = None) -> TrainResult:
        """Run (or resume) training; the trained policy, its metrics and the evaluations before/after."""
        if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int)
                                       or stop_after < 1):
            raise UserError(f"RLTrainer.train: stop_after={stop_after!r} must be an integer >= 1 (steps to run)")
        workdir = self.workdir
        resuming = bool(self.resume) and (workdir / "checkpoints").is_dir()
        trainer.check_workdir_for_run(workdir, self.resume)
        if self.config.model.lora.rank and (self._model is None or self._model.run is None):
            check_rank(model_and_tokenizer(self.config.model, task_of(self.config))[0])  # before a file is written

        def run(observers: Sequence[Any]) -> dict[str, Any]:
            config = self.config
            if self._model is not None:
                self._model.prepare(workdir, resuming)  # a kljax run as the model: exported first
            if self._data is not None:
                self._data.record(workdir, resuming)  # the data copy, after the workdir checks
            config = fit_prompt_len(config, self.explicit)
            self.config = config
            if distributed.is_main_process():  # beside the verdict the run prints next
                for line in (self.trl.report() if self.trl is not None else []) + self.notes:
                    print(line if line.startswith("kljax") else f"kljax: {line}", flush=True)
            mine = [self.callbacks] if self.callbacks is not None else []
            return trainer.train(config, workdir, resume=self.resume, progress=self.progress, stop_after=stop_after,
                                 functions=self.reward_funcs, observers=[*observers, *mine],
                                 reward_guard=in_process_guard)

        summary = guarded_run(workdir, run, lock=distributed.is_main_process())
        policy = dataclasses.replace(summary["policy"], params=summary["params"])
        self.result = TrainResult(policy, read_jsonl(workdir / "metrics.jsonl"), summary["before"], summary["after"],
                                  workdir, summary.get("stopped_at"), summary.get("exact"))
        return self.result

    def save_pretrained(self, out_dir: str | os.PathLike, *, overwrite: bool = False, step: int | None = None,
                        dtype: str | None = None, format: str = "merged") -> Path:  # noqa: A002 - export's name
        """Write the trained policy (the run's latest checkpoint, or `step`) as a Hugging Face checkpoint
        with its tokenizer (`kljax export`); the directory written. With LoRA adapters, `format="peft"`
        writes a PEFT adapter directory for the base instead of the merged model."""
        where = "RLTrainer.save_pretrained"
        if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
            raise UserError(f"{where}: out_dir={out_dir!r} must be a directory path")
        if format not in EXPORT_FORMATS:
            raise UserError(f"{where}: format={format!r} is not one of {', '.join(map(repr, EXPORT_FORMATS))}")
        if dtype is not None and dtype not in EXPORT_DTYPES:
            raise UserError(f"{where}: dtype={dtype!r} is not one of {list(EXPORT_DTYPES)} (None: the run's)")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise UserError(f"{where}: step={step!r} must be a checkpoint step (an integer) or None for the latest")
        if not isinstance(overwrite, bool):
            raise UserError(f"{where}: overwrite={overwrite!r} must be True or False")
        if not is_run_workdir(self.workdir):
            raise UserError(f"{where}: {self.workdir} holds no trained run yet; call train() first")
        written, _ = export_run(self.workdir, out_dir, step=step, dtype=dtype, overwrite=overwrite, fmt=format)
        return written

    def save_model(self, output_dir: str | os.PathLike | None = None, _internal_call: bool = False) -> Path:
        """TRL's (transformers') name for `save_pretrained(output_dir)`; the directory must be given
        (the run's own workdir is never written over)."""
        if output_dir is None:
            raise UserError("RLTrainer.save_model: give output_dir, a directory outside the run "
                            f"({self.workdir}); TRL's default, the run's own output_dir, is not written over")
        return self.save_pretrained(output_dir)
