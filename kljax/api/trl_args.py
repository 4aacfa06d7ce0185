"""TRL's `GRPOConfig` / `RLOOConfig` (or a dict of their field names) as kljax run config fields.

    t = translate_trl(GRPOConfig(output_dir="runs/x", beta=0.04, ...), rows=len(dataset))
    t.fields        # {"kl.estimator": "k3", "kl.placement": "loss", "rl.group_size": 8, ...}
    t.report()      # what maps exactly, approximately, and what has no effect in kljax

The objective's part (beta, loss_type, scale_rewards, epsilon, ...) goes through the translation of
`kljax audit trl-grpo` / `trl-rloo` (`kljax.verdicts.audit`); everything else (length, schedule,
batch, sampler, checkpoints, logging) is mapped here. A field left unset keeps TRL's default (TRL
1.16.0, the version the audit read), so a TRL job keeps TRL's learning rate, linear schedule and
temperature 1. A setting that changes nothing in kljax is named, never dropped.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import warnings
from collections.abc import Mapping
from typing import Any

from kljax.errors import UserError
from kljax.verdicts.audit import objective_fields, translation

TRL_VERSION = "TRL 1.16.0"
# TRL's defaults of what kljax maps (GRPOConfig, RLOOConfig and the TrainingArguments they extend,
# after their __post_init__; tests/test_trl_job.py checks them against the installed TRL).
COMMON: dict[str, Any] = {
    "output_dir": None, "max_steps": -1, "num_train_epochs": 3.0, "save_steps": 500, "save_total_limit": None,
    "eval_strategy": "no", "eval_steps": None, "seed": 42, "report_to": "none", "run_name": None,
    "learning_rate": 1e-6, "lr_scheduler_type": "linear", "warmup_steps": 0,
    "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0,
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "steps_per_generation": None,
    "gradient_checkpointing": True, "bf16": None, "fp16": False, "max_completion_length": 512, "temperature": 1.0,
    "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0, "generation_kwargs": None,
    "num_iterations": 1, "epsilon": 0.2, "epsilon_high": None, "reward_weights": None,
    "mask_truncated_completions": False,
}
DEFAULTS = {
    "grpo": {**COMMON, "num_generations": 8, "beta": 0.0, "loss_type": "dapo", "scale_rewards": "group",
             "use_bias_correction_kl": True, "importance_sampling_level": "token", "delta": None},
    "rloo": {**COMMON, "num_generations": 2, "beta": 0.05, "normalize_advantages": False},
}
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
TRACKERS = ("tensorboard", "wandb", "mlflow")
# TRL settings whose effect kljax leaves out on purpose (prefix: why); the user reads these
NO_EFFECT = {
    "use_vllm": "kljax samples with its own jitted sampler", "vllm_": "kljax samples with its own jitted sampler",
    "deepspeed": "kljax shards with a JAX mesh (config.mesh)", "fsdp": "kljax shards with a JAX mesh (config.mesh)",
    "accelerator_config": "kljax shards with a JAX mesh", "ddp_": "kljax shards with a JAX mesh",
    "dataloader_": "kljax reads the data itself", "torch_compile": "kljax is compiled by XLA",
    "optim": "kljax's optimizer is AdamW", "use_cpu": "JAX picks the device", "tf32": "JAX picks the precision",
    "logging_": "kljax logs every step", "push_to_hub": "kljax does not upload: `kljax export RUN --out DIR`, then "
    "huggingface_hub's upload_folder", "hub_": "kljax does not upload",
    "log_completions": "samples.jsonl: config log_samples_every", "num_completions_to_print": "samples.jsonl",
    "disable_dropout": "kljax's models have no dropout", "ds3_gather_for_generation": "no DeepSpeed in kljax",
    "cache_implementation": "kljax's sampler has its own KV cache", "use_liger_kernel": "no PyTorch kernels here",
    "model_init_kwargs": "the model is given to RLTrainer", "shuffle_dataset": "kljax shuffles every epoch",
    "remove_unused_columns": "every column reaches the reward functions", "eval_": "see eval_strategy",
    "per_device_eval_batch_size": "kljax batches evaluation itself", "save_strategy": "see save_steps",
    "save_only_model": "kljax checkpoints the whole state", "log_level": "kljax prints its own lines",
    "disable_tqdm": "RLTrainer(progress=False)", "include_num_input_tokens_seen": "num_tokens is logged anyway",
    "chat_template_kwargs": "give RLTrainer processing_class or chat_template", "pad_to_multiple_of":
    "kljax pads by buckets", "generation_batch_size": "kljax generates one step's batch at a time",
    "activation_checkpointing": "see gradient_checkpointing", "overwrite_output_dir": "kljax never writes over a run",
    "run_name": "logging.run_name", "save_safetensors": "kljax export writes safetensors",
}
UNSUPPORTED = {  # TRL settings kljax has no counterpart for, when set: what TRL does with them
    "entropy_coef": "adds an entropy bonus to the loss", "top_entropy_quantile": "trains only high-entropy tokens",
    "sync_ref_model": "moves the reference model toward the policy", "off_policy_mask_threshold":
    "masks sequences by their KL to the sampler", "multi_objective_aggregation": "normalizes each reward first",
    "use_adaptive_entropy": "adapts an entropy bonus", "num_generations_eval": "samples another group size for eval",
    "max_tool_calling_iterations": "runs tools", "vllm_importance_sampling_correction": "corrects for vLLM's sampler",
}


@dataclasses.dataclass
class TrlTranslation:
    """kind: "grpo" or "rloo"; fields: kljax's dotted config fields; output_dir: TRL's; epochs: its
    num_train_epochs when max_steps is unset and the rows were unknown (the caller sets steps);
    exact / approximate / no_effect: one entry per TRL setting."""

    kind: str
    fields: dict[str, Any]
    output_dir: str | None
    epochs: float | None
    exact: list[str]
    approximate: list[str]
    no_effect: list[str]

    def report(self) -> list[str]:
        """The lines a run prints beside its verdict."""
        lines = [f"kljax: TRL {self.kind.upper()} config ({TRL_VERSION}'s defaults where unset); mapped exactly: "
                 f"{', '.join(self.exact) or 'the defaults'}"]
        lines += [f"kljax: TRL, approximately: {a}" for a in self.approximate]
        if self.no_effect:
            lines.append(f"kljax: TRL settings with no effect here: {'; '.join(self.no_effect)}")
        return lines


def is_trl_config(value: Any) -> bool:
    """A GRPOConfig / RLOOConfig (or a subclass), or a dict naming TRL fields and no kljax section."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and any(
            cls.__name__ in ("GRPOConfig", "RLOOConfig") for cls in type(value).__mro__):
        return True
    if not isinstance(value, Mapping) or not value:
        return False
    keys = {str(k).split(".")[0] for k in value}
    trl = keys & (set(DEFAULTS["grpo"]) | set(DEFAULTS["rloo"])) - {"seed"}
    return bool(trl) and not keys & {"model", "task", "reward", "logging", "kl", "rl", "optim", "mesh", "steps"}


def _plain(value: Any) -> Any:
    value = value.value if isinstance(value, enum.Enum) else value
    return list(value) if isinstance(value, tuple) else value


def _values(args: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(kind, every given field's value, the fields whose value differs from TRL's default)."""
    if isinstance(args, Mapping):
        kind = "rloo" if "normalize_advantages" in args else "grpo"
        values = {str(k): _plain(v) for k, v in args.items()}
        return kind, values, {k: v for k, v in values.items() if DEFAULTS[kind].get(k, object()) != v}
    kind = "rloo" if any(c.__name__ == "RLOOConfig" for c in type(args).__mro__) else "grpo"
    reference = _reference(args)
    values, changed = {}, {}
    for f in dataclasses.fields(args):
        value = _plain(getattr(args, f.name))
        values[f.name] = value
        if reference is not None:
            default = _plain(getattr(reference, f.name))
        elif f.default is not dataclasses.MISSING:
            default = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _plain(f.default_factory())
        else:
            default = object()
        if f.name != "output_dir" and str(value) != str(default):
            changed[f.name] = value
    return kind, values, changed


def _reference(args: Any) -> Any:
    """The same class with only output_dir (and use_cpu) set: the values its __post_init__ derives
    (bf16, generation_batch_size, ...) are TRL's defaults, not the user's settings. None if it fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(args)(output_dir=getattr(args, "output_dir", None) or "trl-output", use_cpu=True)
    except Exception:  # noqa: BLE001 - a class that cannot be built so: compare with its field defaults
        return None


def translate_trl(args: Any, rows: int | None = None, devices: int = 1) -> TrlTranslation:
    """The kljax fields of a TRL config (see the module docstring). `rows`: the training rows, for
    `num_train_epochs` when `max_steps` is unset (None: unknown; `epochs` is then set); `devices`: the
    accelerators the run uses, TRL's world size (its batch is per device)."""
    kind, given, changed = _values(args)
    v = {**DEFAULTS[kind], **{k: given[k] for k in given if k in DEFAULTS[kind]}}
    audit = translation(f"trl-{kind}", {k: v[k] for k in _audit_keys(kind) if v[k] is not None})
    approx = list(audit.approximations)
    f: dict[str, Any] = dict(objective_fields(audit.run))
    exact = [k for k in _audit_keys(kind) if k in changed]
    f.update(_batch(v, rows, devices, approx))
    steps = f.get("steps")
    f.update(_optimizer(v, given, steps, approx))
    f.update(_sampler(v, approx))
    # model, checkpoints, logging
    bf16 = v["bf16"] if v["bf16"] is not None else not v["fp16"]  # TRL: bf16 unless fp16
    f["model.dtype"] = "float16" if v["fp16"] else "bfloat16" if bf16 else "float32"
    checkpointing = given.get("activation_checkpointing", v["gradient_checkpointing"])
    f["model.remat"] = "full" if checkpointing else "none"
    save = float(v["save_steps"])
    f["checkpoint_every"] = max(1, int(save) if save >= 1 else math.ceil(save * (steps or 1)))
    if v["save_total_limit"]:
        f["keep_checkpoints"] = int(v["save_total_limit"])
    elif steps:
        f["keep_checkpoints"] = max(1, math.ceil(steps / f["checkpoint_every"]))  # TRL keeps every checkpoint
    strategy = str(v["eval_strategy"])
    if strategy == "steps":
        f["eval_every"] = int(v["eval_steps"] or given.get("logging_steps") or 10)
    elif strategy == "epoch" and rows:
        f["eval_every"] = max(1, math.ceil(rows / f["rl.prompts_per_step"]))
    f["seed"] = int(v["seed"])
    f["logging.report_to"] = _report_to(v["report_to"], approx)
    if v["run_name"]:
        f["logging.run_name"] = str(v["run_name"])
    if v["reward_weights"] is not None:
        f["reward.weights"] = [float(w) for w in v["reward_weights"]]
    if v.get("delta") is not None and int(v["num_iterations"]) > 1:
        approx.append(f"delta={v['delta']} caps TRL's importance ratio from above; kljax does not (on-policy, with "
                      "num_iterations=1, the ratio is 1 and it changes nothing)")
    mapped = set(DEFAULTS[kind]) | {"activation_checkpointing"}
    exact += sorted(k for k in changed if k in mapped and k not in exact and k != "output_dir")
    no_effect = _no_effect(changed, mapped, approx)
    epochs = float(v["num_train_epochs"]) if steps is None else None
    return TrlTranslation(kind, f, v["output_dir"], epochs, exact, approx, no_effect)


def _batch(v: Mapping[str, Any], rows: int | None, devices: int, approx: list[str]) -> dict[str, Any]:
    """steps, prompts per step and micro-batches from TRL's batch and length settings: TRL generates
    per_device_train_batch_size x devices x gradient_accumulation_steps completions per step."""
    f: dict[str, Any] = {}
    accum = int(v["gradient_accumulation_steps"])
    batch = int(v["per_device_train_batch_size"]) * devices * accum
    group = int(v["num_generations"])
    if batch % group:
        raise UserError(f"TRL config: per_device_train_batch_size x {devices} device(s) x gradient_accumulation_steps "
                        f"= {batch} completions per step is not a multiple of num_generations={group}")
    f["rl.prompts_per_step"] = batch // group
    if accum > 1:
        f["rl.micro_batches"] = accum
    spg = v.get("steps_per_generation")
    if spg not in (None, accum):
        approx.append(f"steps_per_generation={spg}: TRL splits one generation over {spg} optimizer steps, the later "
                      "ones on stale samples; kljax generates every step")
    if int(v["max_steps"]) > 0:
        f["steps"] = int(v["max_steps"])
    elif rows is not None:
        f["steps"] = max(1, math.ceil(float(v["num_train_epochs"]) * rows / f["rl.prompts_per_step"]))
    return f


def _optimizer(v: Mapping[str, Any], given: Mapping[str, Any], steps: int | None,
               approx: list[str]) -> dict[str, Any]:
    schedule = str(v["lr_scheduler_type"])
    f: dict[str, Any] = {
        "optim.learning_rate": float(v["learning_rate"]), "optim.weight_decay": float(v["weight_decay"]),
        "optim.b1": float(v["adam_beta1"]), "optim.b2": float(v["adam_beta2"]), "optim.eps": float(v["adam_epsilon"]),
        "optim.max_grad_norm": float(v["max_grad_norm"]) if v["max_grad_norm"] else None,
        "optim.schedule": SCHEDULES.get(schedule, "constant"),
    }
    if schedule not in SCHEDULES:
        approx.append(f"lr_scheduler_type={schedule!r} has no kljax schedule: constant instead (kljax has constant, "
                      "linear and cosine, with warmup)")
    warmup = float(v.get("warmup_steps") or 0)
    ratio = float(given.get("warmup_ratio") or (warmup if 0 < warmup < 1 else 0.0))
    if ratio and steps:
        f["optim.warmup_steps"] = math.ceil(ratio * steps)
    elif ratio:
        approx.append(f"warmup ratio {ratio:g} needs the run's length: give max_steps; no warmup instead")
    else:
        f["optim.warmup_steps"] = int(warmup)
    return f


def _sampler(v: Mapping[str, Any], approx: list[str]) -> dict[str, Any]:
    gen = dict(v.get("generation_kwargs") or {})
    f: dict[str, Any] = {
        "rl.temperature": float(gen.pop("temperature", v["temperature"])),
        "rl.top_p": float(gen.pop("top_p", v["top_p"])),
        "rl.top_k": int(gen.pop("top_k", v["top_k"]) or 0),
        "rl.min_p": float(gen.pop("min_p", v["min_p"]) or 0.0),
        "rl.repetition_penalty": float(gen.pop("repetition_penalty", v["repetition_penalty"])),
        "rl.max_new_tokens": int(gen.pop("max_new_tokens", v["max_completion_length"])),
        "rl.mask_truncated": bool(v["mask_truncated_completions"]),
    }
    gen.pop("do_sample", None)
    if gen:
        approx.append(f"generation_kwargs {sorted(gen)} have no kljax sampler setting: left out")
    return f


def _audit_keys(kind: str) -> tuple[str, ...]:
    if kind == "rloo":
        return ("beta", "normalize_advantages", "num_iterations", "epsilon", "epsilon_high", "max_completion_length",
                "num_generations")
    return ("beta", "loss_type", "use_bias_correction_kl", "scale_rewards", "importance_sampling_level",
            "num_iterations", "epsilon", "epsilon_high", "max_completion_length", "num_generations")


def _report_to(value: Any, approx: list[str]) -> str:
    names = [p.strip() for p in value.split(",")] if isinstance(value, str) else [str(n) for n in value or []]
    names = [n for n in names if n and n != "none"]
    if names == ["all"]:
        return "all"
    other = [n for n in names if n not in TRACKERS]
    if other:
        approx.append(f"report_to {other}: kljax reports to tensorboard, wandb and mlflow: left out")
    return ",".join(n for n in names if n in TRACKERS) or "none"


def _no_effect(changed: Mapping[str, Any], mapped: set[str], approx: list[str]) -> list[str]:
    out = []
    for key, value in sorted(changed.items()):
        if key in mapped or key == "output_dir":
            continue
        if key in UNSUPPORTED:
            approx.append(f"{key}={value!r} {UNSUPPORTED[key]} in TRL; kljax has no such setting: left out")
            continue
        why = next((w for prefix, w in NO_EFFECT.items() if key.startswith(prefix)), "not a setting of kljax")
        out.append(f"{key}={value!r} ({why})")
    return out


PEFT_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
                "down_proj": "down"}
PEFT_DEFAULTS = {"lora_dropout": 0.0, "bias": "none", "modules_to_save": None, "use_dora": False,
                 "fan_in_fan_out": False, "init_lora_weights": True, "layers_to_transform": None,
                 "rank_pattern": {}, "alpha_pattern": {}, "exclude_modules": None}


def lora_fields(peft_config: Any) -> tuple[dict[str, Any], list[str]]:
    """(model.lora.* fields, what differs from PEFT) of a `peft.LoraConfig` (or a dict of its fields):
    r, lora_alpha, target_modules (names ending in q/k/v/o/gate/up/down_proj, or "all-linear") and
    use_rslora (scale alpha / sqrt(r), as alpha * sqrt(r) / r) map exactly; a setting kljax's adapters
    do not have is a UserError naming it, except dropout (named: kljax's adapters have none)."""
    get = peft_config.get if isinstance(peft_config, Mapping) else (lambda k, d=None: getattr(peft_config, k, d))
    if not isinstance(peft_config, Mapping) and get("r") is None:
        raise UserError(f"RLTrainer: peft_config={peft_config!r} is a {type(peft_config).__name__}; give a "
                        "peft.LoraConfig (or a dict of its fields)")
    if str(get("peft_type", "LORA")).upper().rsplit(".", 1)[-1] != "LORA":
        raise UserError(f"RLTrainer: peft_config is a {get('peft_type')} config; kljax trains LoRA adapters only")
    r, alpha = int(get("r", 8)), float(get("lora_alpha", 8))
    modules = get("target_modules")
    if modules is None or modules == "all-linear":
        targets = list(PEFT_TARGETS.values())
    elif isinstance(modules, str):
        raise UserError(f"RLTrainer: peft_config.target_modules={modules!r} (a regular expression) is not supported; "
                        f"list module names from {sorted(PEFT_TARGETS)} or 'all-linear'")
    else:
        names = [str(m).rsplit(".", 1)[-1] for m in modules]
        bad = sorted(n for n in names if n not in PEFT_TARGETS)
        if bad:
            raise UserError(f"RLTrainer: peft_config.target_modules {bad} have no kljax adapter; choose from "
                            f"{sorted(PEFT_TARGETS)} or 'all-linear'")
        targets = [t for name, t in PEFT_TARGETS.items() if name in names]
    notes = []
    if get("use_rslora", False):
        alpha = alpha * r ** 0.5  # kljax scales by alpha / r
    for key, default in PEFT_DEFAULTS.items():
        value = get(key, default)
        if value in (default, None, {}, [], ()) or (key == "init_lora_weights" and value is True):
            continue
        if key == "lora_dropout":
            notes.append(f"lora_dropout={value}: kljax's adapters have no dropout (PEFT's is off at inference)")
            continue
        raise UserError(f"RLTrainer: peft_config.{key}={value!r} is not supported by kljax's adapters (r, lora_alpha, "
                        "target_modules and use_rslora are)")
    return {"model.lora.rank": r, "model.lora.alpha": alpha, "model.lora.targets": ",".join(targets)}, notes
