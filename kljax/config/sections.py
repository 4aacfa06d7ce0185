"""The sections of a run config that are not the RL or KL settings: model, task, reward, optimizer,
logging and mesh. Frozen dataclasses; each checks its own values in `__post_init__` and raises a
`UserError` naming the field (`config.SECTION.FIELD=value`), the value and what is valid.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from kljax.errors import UserError

MODEL_SOURCES = ("tiny", "default", "tabular")  # or a Hugging Face checkpoint directory
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_no_batch_saveable")
KERNELS = ("auto", "plain", "cpu")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
PROMPT_FORMATS = ("auto", "chat", "plain", "raw")
ANSWER_FORMATS = ("boxed", "answer_line")
SCHEDULES = ("constant", "cosine", "linear")
TRACKERS = ("tensorboard", "wandb", "mlflow")
ON_ERROR = ("raise", "skip")


def number(name: str, value: Any, low: float | None = None, high: float | None = None, *,
           low_open: bool = False, high_open: bool = False, optional: bool = False) -> None:
    """A finite number within the bounds (open or closed), else a UserError naming `name`."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{name}={value!r} must be a finite number{' (or None)' if optional else ''}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        if low is not None and high is not None:
            where = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            where = f"{'>' if low_open else '>='} {low:g}"
        else:
            where = f"{'<' if high_open else '<='} {high:g}"
        raise UserError(f"{name}={value!r} must be {where}")


def choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise UserError(f"{name}={value!r} is not valid; choose one of {list(valid)}")


def at_least(name: str, value: int, low: int, why: str = "") -> None:
    if value < low:
        raise UserError(f"{name}={value!r} must be an integer >= {low}{why}")


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (`kljax.models.lora`): rank r >= 1, alpha (the scale is alpha / r), target names."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"model.lora.rank={self.rank!r} must be an integer >= 1 (0 turns LoRA off)")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise UserError(f"model.lora.alpha={self.alpha!r} must be a number > 0")
        bad = [t for t in self.targets if t not in LORA_TARGETS]
        if bad or not self.targets or len(set(self.targets)) != len(self.targets):
            raise UserError(f"model.lora.targets={','.join(self.targets)!r}: {bad or 'empty or repeated'} not valid; "
                            f"a comma-separated subset of {','.join(LORA_TARGETS)}")

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """model.lora: rank 0 trains every weight; rank r trains adapters over a frozen base."""

    rank: int = 0
    alpha: float = 16.0
    targets: str = ",".join(LORA_TARGETS)

    def __post_init__(self) -> None:
        at_least("config.model.lora.rank", self.rank, 0, " (0: full fine-tuning)")
        self.adapters()

    def adapters(self) -> LoraConfig | None:
        return None if self.rank == 0 else LoraConfig(self.rank, float(self.alpha), comma_list(self.targets))


@dataclasses.dataclass(frozen=True)
class TinySection:
    """model.tiny: the sizes of the random "tiny" model."""

    vocab_size: int = 19
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    max_position_embeddings: int = 64
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "init_std":
                at_least(f"config.model.tiny.{f.name}", getattr(self, f.name), 1)
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"config.model.tiny.num_heads={self.num_heads} must be a multiple of "
                            f"config.model.tiny.num_kv_heads={self.num_kv_heads}")
        number("config.model.tiny.init_std", self.init_std, 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class TabularSection:
    """model.tabular: pi_ref's logits ~ init_scale * N(0, 1)."""

    init_scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """model: source ("tiny", "default" = SmolLM2-135M-Instruct, "tabular", or an HF checkpoint
    directory), dtypes, layer scan, rematerialization, kernels ("auto": the XLA-CPU kernels on a CPU,
    plain JAX elsewhere), LoRA adapters; chat_template: a Jinja chat template replacing the
    tokenizer's own ("": the tokenizer's; RLTrainer's processing_class / chat_template set it)."""

    source: str = "default"
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    kernels: str = "auto"
    lora: LoraSection = LoraSection()
    tiny: TinySection = TinySection()
    tabular: TabularSection = TabularSection()
    chat_template: str = ""

    def __post_init__(self) -> None:
        if self.chat_template and self.source in ("tiny", "tabular"):
            raise UserError(f"config.model.chat_template needs a Hugging Face tokenizer; model.source={self.source!r} "
                            "has its own symbol tokenizer and no chat template")
        for name, valid in (("dtype", DTYPES), ("param_dtype", DTYPES), ("remat", REMAT_POLICIES),
                            ("kernels", KERNELS)):
            choice(f"config.model.{name}", getattr(self, name), valid)
        if self.source == "tabular" and self.lora.rank:
            raise UserError("config.model.lora.rank > 0 needs a transformer: model.source='tabular' has no projections")
        if not self.source:
            raise UserError(f"config.model.source='' names no model; give one of {list(MODEL_SOURCES)} or a "
                            "checkpoint directory")


@dataclasses.dataclass(frozen=True)
class ToySection:
    """task.toy (task toy_optimum): one prompt per reward shape, responses of response_len tokens."""

    shapes: str = "sparse,long,conflict"
    vocab: int = 3
    response_len: int = 3


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """task: a built-in task or the user's data (name jsonl, parquet, csv or hf with `path`).

    eval_splits "": the task's own; prompt_format "auto": built-in tasks through the chat template,
    the user's data as TRL sends it; answer_format "": the task's own; system_prompt None: kljax's
    default for built-in tasks, none for data files."""

    name: str = "arithmetic"
    split: str = "train"
    eval_splits: str = ""
    prompt_format: str = "auto"
    answer_format: str = ""
    data_dir: str = ""
    path: str = ""
    prompt_key: str = "prompt"
    answer_key: str = ""
    messages_key: str = ""
    eval_fraction: float = 0.1
    prompt_template: str = ""
    drop_overlong: bool = False
    system_prompt: str | None = None
    toy: ToySection = ToySection()

    def __post_init__(self) -> None:
        choice("config.task.prompt_format", self.prompt_format, PROMPT_FORMATS)
        if self.answer_format and self.answer_format not in ANSWER_FORMATS:
            raise UserError(f"config.task.answer_format={self.answer_format!r} is not valid; choose one of "
                            f"{sorted(ANSWER_FORMATS)} or '' for the task's default")
        if self.eval_splits.strip() and any(not p.strip() for p in self.eval_splits.split(",")):
            raise UserError(f"config.task.eval_splits={self.eval_splits!r} has an empty split name; give "
                            "comma-separated split names, e.g. 'test,ood_digits', or '' for the task's own")
        number("config.task.eval_fraction", self.eval_fraction, 0, 1, high_open=True)

    @property
    def eval_split_names(self) -> tuple[str, ...]:
        return comma_list(self.eval_splits)


@dataclasses.dataclass(frozen=True)
class RewardSection:
    """reward: functions (specs: built-in names, `module.path:fn`, `file.py:fn`; none = the task's own
    check), their weights (None: all 1), what a failing function does, an optional worker-process time
    limit, and an HF sequence-classification reward model."""

    functions: tuple[str, ...] = ()
    weights: tuple[float, ...] | None = None
    on_error: str = "raise"
    timeout_s: float | None = None
    model: str = ""
    model_weight: float = 1.0
    model_max_len: int = 0

    def __post_init__(self) -> None:
        choice("reward.on_error", self.on_error, ON_ERROR)
        if self.timeout_s is not None and not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise UserError(f"reward.timeout_s={self.timeout_s!r} must be a number of seconds > 0, or None to run "
                            "reward functions in this process")
        if self.weights is not None and not all(math.isfinite(w) for w in self.weights):
            raise UserError(f"reward.weights={list(self.weights)!r} must be finite numbers, one per reward function")
        if self.functions and self.weights is not None and len(self.weights) != len(self.functions):
            raise UserError(f"reward.weights={list(self.weights)!r} has {len(self.weights)} values for "
                            f"{len(self.functions)} reward functions {list(self.functions)}")
        if any(not f for f in self.functions):
            raise UserError(f"reward.functions={list(self.functions)!r} holds an empty name")
        number("reward.model_weight", self.model_weight)
        at_least("reward.model_max_len", self.model_max_len, 0, " (0: from rl's lengths)")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with global-norm clipping and a warmup + constant/cosine/linear schedule over total_steps
    (None: the run's steps)."""

    learning_rate: float = 1e-5
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    end_lr_fraction: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        choice("optim.schedule", self.schedule, SCHEDULES)
        number("optim.learning_rate", self.learning_rate, 0, low_open=True)
        number("optim.b1", self.b1, 0, 1, high_open=True)
        number("optim.b2", self.b2, 0, 1, high_open=True)
        number("optim.eps", self.eps, 0, low_open=True)
        number("optim.weight_decay", self.weight_decay, 0)
        number("optim.end_lr_fraction", self.end_lr_fraction, 0, 1)
        number("optim.max_grad_norm", self.max_grad_norm, 0, low_open=True, optional=True)
        at_least("optim.warmup_steps", self.warmup_steps, 0)
        if self.total_steps is not None:
            at_least("optim.total_steps", self.total_steps, 1)


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """logging: trackers beside metrics.jsonl ("tensorboard", "wandb", "mlflow", comma-separated,
    "all", or "none"/""); project: the W&B project / MLflow experiment; run_name ("": the workdir's name)."""

    report_to: str = "tensorboard"
    project: str = "kljax"
    run_name: str = ""

    def __post_init__(self) -> None:
        self.reporters  # noqa: B018 - checks the names

    @property
    def reporters(self) -> tuple[str, ...]:
        """The trackers named, in order, each once; a UserError for an unknown or empty name."""
        parts = [p.strip().lower() for p in self.report_to.split(",")] if self.report_to.strip() else []
        names = tuple(dict.fromkeys(parts))
        if names in (("none",), ("all",)):
            return () if names == ("none",) else TRACKERS
        unknown = [n for n in names if n not in TRACKERS]
        if unknown:
            what = "an empty tracker name" if "" in names else f"unknown tracker(s) {unknown}"
            raise UserError(f"logging.report_to={self.report_to!r}: {what}; choose from {', '.join(TRACKERS)} "
                            "(comma-separated), 'all' or 'none'")
        return names


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """mesh: device-mesh axis sizes; -1 takes the devices left over."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def __post_init__(self) -> None:
        for axis in ("data", "fsdp", "tensor"):
            size = getattr(self, axis)
            if not (size >= 1 or size == -1):
                raise UserError(f"config.mesh.{axis}={size!r} must be a positive integer or -1 (the rest)")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.tensor)
