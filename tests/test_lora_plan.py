"""`kljax plan` with LoRA: the state holds the adapters and their moments, the frozen base is the one
copy that is also the reference, and the saving against full fine-tuning is what the plan reports."""

import math

import jax
import jax.numpy as jnp

from kljax.config import load_run_config, with_overrides
from kljax.config.load import CONFIGS_DIR
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.studies.plan import format_plan, make_plan, resolve_model

REPO_ROOT = CONFIGS_DIR.parent

TINY = REPO_ROOT / "configs" / "tiny.py"


def test_lora_plan_counts_adapters_moments_and_one_base_copy():
    config = load_run_config((TINY), ["--config.model.dtype=bfloat16"])
    with_lora = with_overrides(config, ["--config.model.lora.rank=4", "--config.model.lora.targets=q,v,down"])
    devices = jax.devices("cpu")[:8]
    full = make_plan(config, (1, 8, 1), devices=devices, programs=("train",), top=0)
    plan = make_plan(with_lora, (1, 8, 1), devices=devices, programs=("train",), top=0)
    model, _ = resolve_model(with_lora.model)
    base_scalars = sum(math.prod(x.shape) for x in jax.tree.leaves(tfm.param_shapes(model)))
    assert plan.ref_params == full.ref_params  # the base, frozen in the compute dtype, once
    assert base_scalars * 2 / 8 <= plan.ref_params <= base_scalars * 2
    adapters = lora.adapter_shapes(model)
    assert lora.count(model) == sum(x.size for x in jax.tree.leaves(adapters)) == plan.lora["adapter_params"]
    # every adapter has a dimension that splits over 8 devices except the rank: at most all of them, at least 1/8
    assert lora.count(model) * 4 / 8 <= plan.params <= lora.count(model) * 4
    assert plan.opt_state >= 2 * plan.params and plan.opt_state < 2 * plan.params + 1024  # mu, nu + counts
    assert plan.lora["reference_copy_saved"] == plan.ref_params
    assert full.resident - plan.resident == (full.params + full.opt_state) - (plan.params + plan.opt_state)
    assert full.params > plan.params and jnp.dtype(model.dtype) == jnp.bfloat16
    text = format_plan(plan)
    assert "LoRA rank 4" in text and "frozen base = reference (one copy)" in text
