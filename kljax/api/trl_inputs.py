"""RLTrainer's TRL-shaped arguments, checked and turned into config fields: `args` (a GRPOConfig,
RLOOConfig or dict of their fields), `processing_class` / `chat_template`, and the GRPOTrainer
arguments kljax does not take (`reward_processing_classes`, `optimizers`), each refused by name."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax

from kljax.api.data import DataSource
from kljax.api.trl_args import TrlTranslation, is_trl_config, translate_trl
from kljax.errors import UserError


def trl_settings(args: Any, config: Any, workdir: str | os.PathLike | None, data: DataSource | None
                 ) -> tuple[TrlTranslation | None, Any, str | os.PathLike | None]:
    """(the translation or None, the config to build on, the workdir): TRL's config given as `args` or
    as `config` becomes a dict of kljax fields, and its output_dir the workdir unless one is given."""
    if args is not None and config is not None:
        raise UserError("RLTrainer: give the settings once: args= (TRL's config) or config=, not both")
    if args is not None and not is_trl_config(args):
        raise UserError(f"RLTrainer: args={args!r} is a {type(args).__name__}; give a trl GRPOConfig or "
                        "RLOOConfig (or a dict of their fields), or kljax's settings as config=")
    trl = args if args is not None else config if is_trl_config(config) else None
    if trl is None:
        return None, config, workdir
    devices = jax.device_count()  # TRL's world size: its batch is per device
    translation = translate_trl(trl, rows=None, devices=devices)
    if translation.epochs is not None:
        if data is None:
            raise UserError("RLTrainer: TRL's num_train_epochs needs a train_dataset to count its rows; give one, "
                            "or set max_steps")
        translation = translate_trl(trl, rows=data.rows(), devices=devices)
    if workdir is None and translation.output_dir:
        workdir = translation.output_dir
    return translation, dict(translation.fields), workdir


def template_fields(processing_class: Any, chat_template: str | None) -> dict[str, Any]:
    """model.chat_template from a tokenizer's chat template or the template itself."""
    if processing_class is not None and not callable(getattr(processing_class, "apply_chat_template", None)):
        raise UserError(f"RLTrainer: processing_class={processing_class!r} is a {type(processing_class).__name__}; "
                        "give a transformers tokenizer (its chat template prompts the data)")
    template = chat_template if chat_template is not None else getattr(processing_class, "chat_template", None)
    if template is None:
        return {}
    if not isinstance(template, str):
        raise UserError(f"RLTrainer: chat_template={template!r} must be a Jinja template string")
    return {"model.chat_template": template}


def check_not_taken(reward_processing_classes: Any, optimizers: Any) -> None:
    """GRPOTrainer's arguments kljax has no use for, refused when set."""
    if reward_processing_classes is not None:
        raise UserError("RLTrainer: reward_processing_classes is not supported; a reward model is set with config "
                        "reward.model (docs/configs.md)")
    if not isinstance(optimizers, (tuple, list)) or any(o is not None for o in optimizers):
        raise UserError("RLTrainer: optimizers= is not supported; kljax's optimizer is AdamW with the config's optim.* "
                        "settings (TRL's learning_rate, lr_scheduler_type, warmup and weight_decay map to them)")


def trl_weights(config: Any, translation: TrlTranslation | None, given: Any) -> Any:
    """The reward weights: RLTrainer's reward_weights, else the TRL config's (taken out of `config`)."""
    if translation is None or not isinstance(config, Mapping) or "reward.weights" not in config:
        return given
    weights = config.pop("reward.weights")
    return weights if given is None else given
