"""Per-device memory plans for a run on a mesh that is not here: ahead-of-time compilation on abstract shapes.

    plan = make_plan(config, mesh_shape=(1, 64, 1), chip="v5e")   # or `kljax plan ...`
    print(format_plan(plan))

The train step, the sampler and the scoring pass are lowered with `jax.ShapeDtypeStruct`s that carry
`NamedSharding`s on a mesh of (simulated) devices and compiled; nothing is allocated. Each compiled
program's `memory_analysis()` gives its per-device arguments, outputs (less donated aliases) and
temporaries. The resident state (parameters, optimizer state, the frozen reference parameters and
off-policy sampler snapshots) is summed exactly from the arrays' shard shapes. A phase's peak is the
resident state plus what its program adds; the run's peak is the largest phase.

The programs are compiled for the CPU backend (simulated devices), so the temporaries are the CPU
compiler's: a TPU or GPU compiler fuses and schedules differently (TPU usually needs less, and CPU
may upcast bfloat16 matmuls to float32). Parameters, optimizer state and KV cache are exact.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from kljax import sampling
from kljax.config.run import RunConfig
from kljax.config.sections import ModelSection
from kljax.models import lora
from kljax.models import transformer as tfm
from kljax.models.config import ModelConfig, num_params
from kljax.models.convert import read_hf_config
from kljax.models.known_configs import KNOWN_CONFIGS
from kljax.parallel import sharding as shd
from kljax.parallel.distributed import check_mesh
from kljax.sampling import sampler
from kljax.sampling.step import cache_bytes
from kljax.train import state as st
from kljax.train.policy import _runtime, tiny_model_config
from kljax.train.rollout import policy_scored_in_update
from kljax.train.step import Batch, StepSettings, score, train_step

GiB = 2**30

# Accelerator memory per JAX device (GiB) and, for TPU names like v5p-32, TensorCores per chip
# (v4/v5p slices are named by TensorCores, and one JAX device is one chip of 2 cores).
CHIPS: dict[str, tuple[float, int]] = {
    "v4": (32, 2), "v5e": (16, 1), "v5p": (95, 2), "v6e": (32, 1),
    "h100": (80, 1), "h200": (141, 1), "a100-40": (40, 1), "a100-80": (80, 1), "a100": (80, 1),
}


@dataclasses.dataclass(frozen=True)
class Chip:
    """A device kind and (when named, as in v5e-64 or 8xh100) how many JAX devices a slice has."""

    name: str
    hbm_bytes: int
    devices: int | None = None


def parse_chip(text: str) -> Chip:
    """'v5e', 'v5e-64' (64 chips), 'v5p-32' (32 cores = 16 chips), '8xh100', 'a100-80', 'h200'."""
    t = text.strip().lower()
    count = None
    m = re.fullmatch(r"(\d+)x(.+)", t)
    if m:
        count, t = int(m.group(1)), m.group(2)
    if t not in CHIPS:
        m = re.fullmatch(r"(v\d+[a-z]?)-(\d+)", t)
        if m and m.group(1) in CHIPS:
            t, cores = m.group(1), int(m.group(2))
            count = max(1, cores // CHIPS[t][1])
    if t not in CHIPS:
        raise ValueError(f"unknown chip {text!r}; known: {sorted(CHIPS)} (TPU slices as v5e-64, GPUs as 8xh100)")
    return Chip(t, int(CHIPS[t][0] * GiB), count)


# ---------------------------------------------------------------------------------------- model


def resolve_model(section: ModelSection) -> tuple[Any, str]:
    """(ModelConfig, name) of config.model without loading weights.

    source: "tiny", "default" (SmolLM2-135M), "known:NAME" (kljax.models.known_configs) or a
    checkpoint directory (only its config.json is read).
    """
    source = section.source
    runtime = _runtime(section)
    if source == "tiny":
        return tiny_model_config(section, section.tiny.vocab_size), "tiny"
    if source == "default":
        source = "known:smollm2-135m"
    if source.startswith("known:"):
        name = source[len("known:"):].strip().lower()
        if name not in KNOWN_CONFIGS:
            raise ValueError(f"config.model.source={source!r}: unknown model; known: "
                             + ", ".join(f"known:{k}" for k in KNOWN_CONFIGS))
        return ModelConfig.from_hf(KNOWN_CONFIGS[name], **runtime), name
    if Path(source, "config.json").is_file():
        return ModelConfig.from_hf(read_hf_config(source), **runtime), Path(source).name
    raise ValueError(f"config.model.source={source!r} is not tiny, default, known:NAME or a directory with "
                     f"config.json; known: " + ", ".join(f"known:{k}" for k in KNOWN_CONFIGS))


# ---------------------------------------------------------------------------------------- memory


@dataclasses.dataclass
class ProgramMemory:
    """Per-device bytes of one compiled program (from `Compiled.memory_analysis()`)."""

    name: str
    argument: int
    output: int
    alias: int
    temp: int
    code: int
    compile_s: float
    largest: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)

    @property
    def footprint(self) -> int:
        """Arguments + new outputs + temporaries: the program's own peak if nothing else were live."""
        return self.argument + self.output - self.alias + self.temp


def sharded_bytes(tree: Any) -> int:
    """Per-device bytes of a pytree of ShapeDtypeStructs (or arrays) with NamedShardings: the largest
    shard of each leaf."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


_SHAPE = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s*=\s*([a-z]+\d*)\[([\d,]*)\]\S*\s+([\w-]+)\(")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8}


_VIEWS = ("bitcast", "get-tuple-element", "tuple", "opt-barrier", "constant")  # no new buffer


def largest_values(hlo_text: str, top: int = 8) -> list[tuple[str, str, int]]:
    """(op, shape, bytes) of the largest array values of an optimized, SPMD-partitioned HLO module
    (per device), outside fusion bodies (values inside a fusion are never materialized)."""
    found: dict[tuple[str, str], int] = {}
    in_fusion = False
    for line in hlo_text.splitlines():
        if line.startswith(("%", "ENTRY")) and line.rstrip().endswith("{"):
            header = line.split("(")[0]
            in_fusion = "fused" in header or "wrapped" in header
            continue
        if in_fusion:
            continue
        m = _SHAPE.match(line)
        if not m or m.group(2) not in _BYTES or m.group(4) in _VIEWS:
            continue
        dims = [int(d) for d in m.group(3).split(",") if d]
        size = math.prod(dims) * _BYTES[m.group(2)]
        key = (m.group(4), f"{m.group(2)}[{','.join(map(str, dims))}]")
        found[key] = max(found.get(key, 0), size)
    ranked = sorted(found.items(), key=lambda kv: -kv[1])[:top]
    return [(op, shape, size) for (op, shape), size in ranked]


def compile_memory(name: str, lowered: Any, top: int = 8) -> ProgramMemory:
    """Compile a lowered program and read its per-device memory."""
    t0 = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    largest = largest_values(compiled.as_text(), top) if top else []
    return ProgramMemory(name, int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                         int(m.temp_size_in_bytes), int(m.generated_code_size_in_bytes), seconds, largest)


# ---------------------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Plan:
    """Per-device memory of one run configuration on one mesh (bytes)."""

    model: str
    num_params: int
    mesh: tuple[int, int, int]
    shapes: dict[str, int]
    dtypes: dict[str, str]
    params: int
    opt_state: int
    ref_params: int
    snapshots: int
    kv_cache: int
    programs: dict[str, ProgramMemory]
    phases: dict[str, int]
    chip: Chip | None = None
    # With model.lora: rank, alpha, targets, adapter_params, and reference_copy_saved (bytes per device
    # a separate reference copy would take: with LoRA the frozen base is the reference, `ref_params`)
    lora: dict[str, Any] | None = None

    @property
    def resident(self) -> int:
        return self.params + self.opt_state + self.ref_params + self.snapshots

    @property
    def peak(self) -> int:
        return max(self.phases.values(), default=self.resident)

    def fits(self) -> bool | None:
        return None if self.chip is None else self.peak <= self.chip.hbm_bytes

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(resident=self.resident, peak=self.peak, fits=self.fits())
        return out


def analytic_state_bytes(num_params: int, param_bytes: int, num_devices: int, moments: int = 2) -> float:
    """(params + Adam moments) per device if every parameter were split evenly over all devices."""
    return num_params * param_bytes * (1 + moments) / num_devices


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def check_plan(config: RunConfig, mesh_shape: tuple[int, int, int],
               num_devices: int) -> tuple[RunConfig, Any, str, tuple[int, int, int]]:
    """Resolve the model without weights and check the mesh against the devices, batch and heads:
    (config, model config, model name, resolved mesh shape). Cheap; nothing compiles."""
    model, name = resolve_model(config.model)
    lora.check_rank(model)
    return config, model, name, check_mesh(mesh_shape, num_devices, config.rl, model)


def make_plan(config: RunConfig, mesh_shape: tuple[int, int, int], *, devices: list | None = None,
              chip: Chip | str | None = None, programs: tuple[str, ...] = ("train", "sample", "score"),
              top: int = 8) -> Plan:
    """Compile the run's programs for `mesh_shape` over `devices` (default: all of this process's
    CPU devices) on abstract inputs and return the per-device memory plan."""
    unknown = sorted(set(programs) - {"train", "sample", "score"})
    if unknown:
        raise ValueError(f"unknown program(s) {unknown}; choose from train, sample, score")
    chip = parse_chip(chip) if isinstance(chip, str) else chip
    devices = list(jax.devices("cpu") if devices is None else devices)
    want = math.prod(mesh_shape) if -1 not in mesh_shape else len(devices)
    settings, model, name, mesh_shape = check_plan(config, mesh_shape, want)
    if chip is not None and model.kernels == "auto":  # a TPU/GPU runs plain JAX: plan that program, not
        model = dataclasses.replace(model, kernels="plain")  # the XLA-CPU kernels this CPU host would pick
    rl = settings.rl
    if want > len(devices):
        raise ValueError(f"the mesh needs {want} devices but this process has {len(devices)}; run `kljax plan`, "
                         "which starts itself with enough simulated devices")
    mesh = shd.make_mesh(*mesh_shape, devices=devices[:want])

    p_sh = shd.logical_to_sharding(tfm.logical_axes(model), tfm.param_shapes(model), mesh)
    params = _abstract(tfm.param_shapes(model), p_sh)
    frozen = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, model.jnp_frozen_dtype, sharding=x.sharding),
                          params)  # the reference and async snapshots (`tfm.frozen_copy`)
    lora_on = model.lora is not None
    if lora_on:  # as `run_build.build`: the state trains the adapters; the frozen base is also the reference
        params = _abstract(lora.adapter_shapes(model), st.adapter_shardings(model, mesh))
        p_sh = jax.tree.map(lambda x: x.sharding, params)
    tx = st.make_optimizer(settings.run_optim)
    fresh = functools.partial(st._fresh_state, tx=tx, seed=settings.seed)
    state_shape = jax.eval_shape(fresh, params)
    state_sh = st.state_shardings(state_shape, p_sh, mesh, tx)
    state = _abstract(state_shape, state_sh)
    ref_arg = (frozen,) if lora_on else ()  # the train step reads the base (and the full KL the reference)
    policy_params = lora.combine if lora_on else (lambda base, trained: trained)  # the policy's full params

    b_prompts, g = rl.prompts_per_step, rl.group_size
    prompt_len = sampling.bucket_length(rl.max_prompt_len)
    rows, resp, seq = b_prompts * g, rl.max_new_tokens, prompt_len + rl.max_new_tokens
    rows_sh = lambda ndim: shd.data_sharding(mesh, ndim)
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows_sh(len(shape)))
    batch = Batch(
        tokens_bs=sds((rows, seq), jnp.int32), mask_bs=sds((rows, seq), jnp.bool_),
        positions_bs=sds((rows, seq), jnp.int32), response_mask_br=sds((rows, resp), jnp.float32),
        sampler_logp_br=sds((rows, resp), jnp.float32), ref_logp_br=sds((rows, resp), jnp.float32),
        advantages_br=sds((rows, resp), jnp.float32),
        beta=jax.ShapeDtypeStruct((), jnp.float32, sharding=shd.replicated(mesh)),
    )
    batch_sh = jax.tree.map(lambda x: x.sharding, batch)

    compiled: dict[str, ProgramMemory] = {}
    if "train" in programs:
        step_settings = StepSettings(model, settings.kl, rl.loss_aggregation, rl.clip_low, rl.clip_high,
                                     rl.micro_batches, kl_metrics=policy_scored_in_update(rl, settings.kl, model))
        step_tx = settings.run_optim if model.cpu_kernels else tx  # as the trainer (`run_build.build`)
        ref_sh = tuple(jax.tree.map(lambda x: x.sharding, r) for r in ref_arg)
        step = jax.jit(functools.partial(train_step, settings=step_settings, tx=step_tx),
                       in_shardings=(state_sh, batch_sh, *ref_sh), out_shardings=(state_sh, None), donate_argnums=0)
        with jax.set_mesh(mesh):  # the context mesh turns on the model's activation sharding constraints
            lowered = step.lower(state, batch, *ref_arg)
        compiled["train"] = compile_memory("train step", lowered, top)
    if "score" in programs:
        scorer = jax.jit(lambda trained, base, b: score(policy_params(base, trained), base, b, model=model,
                                                        micro_batches=rl.micro_batches))
        with jax.set_mesh(mesh):
            lowered = scorer.lower(params, frozen, batch)
        compiled["score"] = compile_memory("score (policy + reference log-probs)", lowered, top)
    if "sample" in programs:
        sp = sampling.SamplingParams(max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p,
                                     top_k=rl.top_k, stop_token_ids=tuple(model.eos_token_ids), n=g)
        prompts = jax.ShapeDtypeStruct((b_prompts, prompt_len), jnp.int32, sharding=rows_sh(2))
        prompt_mask = jax.ShapeDtypeStruct((b_prompts, prompt_len), jnp.bool_, sharding=rows_sh(2))
        key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=shd.replicated(mesh))
        lowered = sampler._generate_jit.lower(policy_params(frozen, params), prompts, prompt_mask, key, config=model,
                                               sampling=sp, mesh=mesh)
        compiled["sample"] = compile_memory("sampler (prefill + decode loop)", lowered, top)

    p_bytes, ref_bytes = sharded_bytes(params), sharded_bytes(frozen)
    opt_bytes = sharded_bytes(state) - p_bytes
    snap_bytes = rl.async_level * (sharded_bytes(params) * model.jnp_frozen_dtype.itemsize // 4 if lora_on
                                   else ref_bytes)  # LoRA: snapshots of the float32 adapters in the frozen dtype
    resident = p_bytes + ref_bytes + opt_bytes + snap_bytes
    base_arg = ref_bytes if lora_on else 0  # the train step and the sampler also read the resident base
    resident_args = {"train": p_bytes + opt_bytes + base_arg, "sample": p_bytes + base_arg,
                     "score": p_bytes + ref_bytes}
    phases = {}
    for key_, prog in compiled.items():
        extra_args = max(prog.argument - resident_args[key_], 0)  # batch / prompts
        phases[key_] = resident + extra_args + prog.output - prog.alias + prog.temp
    data_shards = mesh_shape[0] * mesh_shape[1]
    kv = cache_bytes(model, -(-rows // data_shards), seq - 1)
    return Plan(
        model=name, num_params=num_params(model), mesh=tuple(mesh_shape),
        shapes={"prompts": b_prompts, "group": g, "sequences": rows, "prompt_len": prompt_len,
                "new_tokens": resp, "micro_batches": rl.micro_batches, "async_level": rl.async_level},
        dtypes={"param_dtype": model.param_dtype, "dtype": model.dtype, "remat": model.remat,
                "kernels": "cpu" if model.cpu_kernels else "plain"},
        lora=None if not lora_on else {"rank": model.lora.rank, "alpha": model.lora.alpha,
                                       "targets": list(model.lora.targets), "adapter_params": lora.count(model),
                                       "reference_copy_saved": ref_bytes},
        params=p_bytes, opt_state=opt_bytes, ref_params=ref_bytes, snapshots=snap_bytes, kv_cache=kv,
        programs=compiled, phases=phases, chip=chip,
    )


def _unit(peak: int) -> tuple[str, int]:
    return ("GiB", GiB) if peak >= GiB // 4 else ("MiB", 2**20)


def format_plan(plan: Plan) -> str:
    """The plan as a human-readable table."""
    d, f, t = plan.mesh
    s = plan.shapes
    unit, scale = _unit(plan.peak)
    num = lambda n: f"{n / scale:9.2f}"
    lines = [
        f"kljax plan: {plan.model} ({plan.num_params / 1e9:.2f} B params) on mesh data={d},fsdp={f},tensor={t} "
        f"({d * f * t} devices)",
        f"  batch: {s['prompts']} prompts x {s['group']} samples = {s['sequences']} sequences of "
        f"{s['prompt_len']} + {s['new_tokens']} tokens, {s['micro_batches']} micro-batch(es); "
        f"param_dtype={plan.dtypes['param_dtype']} dtype={plan.dtypes['dtype']} remat={plan.dtypes['remat']} "
        f"kernels={plan.dtypes['kernels']}",
        "",
        f"per device ({unit})",
    ]
    row = lambda label, value: lines.append(f"  {label:<38} {num(value)}")
    if plan.lora is None:
        row("parameters", plan.params)
        row("optimizer state (Adam moments)", plan.opt_state)
        row("reference parameters", plan.ref_params)
    else:
        lines.insert(2, f"  LoRA rank {plan.lora['rank']} (alpha {plan.lora['alpha']:g}) on "
                        f"{','.join(plan.lora['targets'])}: {plan.lora['adapter_params'] / 1e6:.1f} M trained params; "
                        f"the frozen base is also the reference (no second copy: "
                        f"{plan.lora['reference_copy_saved'] / scale:.2f} {unit} per device saved)")
        row("LoRA adapters (trained, float32)", plan.params)
        row("adapters' Adam moments", plan.opt_state)
        row("frozen base = reference (one copy)", plan.ref_params)
    row(f"off-policy snapshots (async_level={s['async_level']})", plan.snapshots)
    row("= resident", plan.resident)
    labels = {"train": "train step", "sample": "sampler", "score": "score"}
    for key, prog in plan.programs.items():
        lines.append(f"  {labels[key] + ': activations/temps':<38} {num(prog.temp)}   phase peak "
                     f"{num(plan.phases[key]).strip()}  (compiled in {prog.compile_s:.0f}s)")
        if key == "sample":
            row("  of which KV cache (analytic)", plan.kv_cache)
    row("PEAK (largest phase)", plan.peak)
    for key, prog in plan.programs.items():
        if prog.largest:
            lines.append(f"largest buffers, {labels[key]} (per device, from the compiled HLO):")
            lines += [f"  {size / scale:9.3f} {unit}  {shape:<28} {op}" for op, shape, size in prog.largest]
    if plan.chip is not None:
        hbm = plan.chip.hbm_bytes
        margin = hbm - plan.peak
        verdict = "FITS" if margin >= 0 else "DOES NOT FIT"
        lines.append(f"{plan.chip.name} ({hbm / GiB:.0f} GiB per device): {verdict}, margin {margin / GiB:+.2f} GiB "
                     f"({100 * margin / hbm:+.0f}%)")
        if 0 <= margin < 0.1 * hbm:
            lines.append("  (tight: runtime buffers, fragmentation and collectives need some headroom)")
    lines.append("Temporaries come from CPU compilations of the same programs; a TPU/GPU compiler schedules and "
                 "fuses differently. Parameters, optimizer state and KV cache are exact.")
    return "\n".join(lines)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, default=str)
