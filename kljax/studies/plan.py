"""Per-device memory plans for a run on a mesh that is not here: ahead-of-time compilation on abstract shapes.

    plan = make_plan(config, mesh_shape=(1, 64, 1), chip="v5e")   # or `kljax plan ...`
    print(format_plan(plan))

The train step, the sampler and the scoring pass are lowered with `jax.ShapeDtypeStruct`s that carry
`NamedSharding`s on a mesh of (simulated) devices and compiled; nothing is allocated. Each compiled
program's `memory_analysis()` gives its per-device arguments, outputs (less donated aliases) and
temporaries. The resident state (parameters, optimizer state, the frozen reference, off-policy sampler
snapshots) is summed exactly from the shard shapes; a phase's peak is it plus what its program adds.

On deviceless TPU devices (`kljax.studies.tpu_topology`, the `tpu` extra) the programs compile with the
TPU compiler, and the temporaries are the TPU's; on simulated CPU devices they are XLA:CPU's, upper bounds
(it upcasts bfloat16 matmuls to float32). Parameters, optimizer state and KV cache are exact either way.
With `roofline`, the step's lower-bound time from the programs' cost analysis (`kljax.studies.roofline`).
"""

from __future__ import annotations

import dataclasses
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
from kljax.models.config import ModelConfig, num_params
from kljax.models.convert import read_hf_config
from kljax.models.known_configs import KNOWN_CONFIGS
from kljax.parallel import sharding as shd
from kljax.parallel.distributed import check_mesh
from kljax.sampling.chunks import num_chunks
from kljax.sampling.step import cache_bytes
from kljax.studies import plan_cost, plan_programs
from kljax.studies.chips import CHIPS, Chip, GiB, parse_chip  # noqa: F401  (the plan's chip API)
from kljax.studies.roofline import Roofline, model_flops
from kljax.studies.tpu_topology import libtpu_version
from kljax.train.policy import _runtime, tiny_model_config

# ---------------------------------------------------------------------------------------- model


def resolve_model(section: ModelSection) -> tuple[Any, str]:
    """(ModelConfig, name) of config.model without loading weights.

    source: "tiny", "default" (SmolLM2-135M), "known:NAME" (kljax.models.known_configs) or a
    checkpoint directory (only its config.json is read).
    """
    source = str(section.source)
    runtime = _runtime(section)
    if source == "tiny":
        return tiny_model_config(section, int(section.tiny.vocab_size)), "tiny"
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
    compiler: str = "XLA:CPU (simulated CPU devices)"
    roofline: Roofline | None = None  # with a chip: the step's lower bound from the programs' cost analysis

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
        out.update(resident=self.resident, peak=self.peak, fits=self.fits(),
                   roofline=None if self.roofline is None else self.roofline.to_dict())
        return out


def analytic_state_bytes(num_params: int, param_bytes: int, num_devices: int, moments: int = 2) -> float:
    """(params + Adam moments) per device if every parameter were split evenly over all devices."""
    return num_params * param_bytes * (1 + moments) / num_devices


def check_plan(config: RunConfig, mesh_shape: tuple[int, int, int],
               num_devices: int) -> tuple[RunConfig, Any, str, tuple[int, int, int]]:
    """Resolve the model without weights and check the mesh against the devices, batch and heads:
    (config, model config, model name, resolved mesh shape). Cheap; nothing compiles."""
    model, name = resolve_model(config.model)
    lora.check_rank(model)
    return config, model, name, check_mesh(mesh_shape, num_devices, config.rl, model)


def compiler_name(devices: list) -> str:
    """Which compiler the plan's programs are compiled by: the TPU compiler for deviceless TPU
    devices (`kljax.studies.tpu_topology`), else XLA:CPU for simulated CPU devices."""
    if devices and devices[0].platform == "tpu":
        return (f"TPU compiler (libtpu {libtpu_version()}) for a deviceless {devices[0].device_kind} slice of "
                f"{len(devices)} chips")
    return "XLA:CPU (simulated CPU devices)"


def make_plan(config: RunConfig, mesh_shape: tuple[int, int, int], *, devices: list | None = None,
              chip: Chip | str | None = None, programs: tuple[str, ...] = ("train", "sample", "score"),
              top: int = 8, roofline: bool = False) -> Plan:
    """Compile the run's programs for `mesh_shape` over `devices` (default: all of this process's
    CPU devices; deviceless TPU devices compile with the TPU compiler) on abstract inputs and return
    the per-device memory plan; with `roofline` (needs `chip`) also the step's roofline bound."""
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
    run = plan_programs.abstract_run(model, settings, mesh)
    lora_on = run.lora_on
    b_prompts, g = rl.prompts_per_step, rl.group_size
    prompt_len = sampling.bucket_length(rl.max_prompt_len)
    rows, resp, seq = b_prompts * g, rl.max_new_tokens, prompt_len + rl.max_new_tokens
    batch = plan_programs.abstract_batch(mesh, rows, prompt_len, resp)

    compiled: dict[str, ProgramMemory] = {}
    if "train" in programs:
        lowered = plan_programs.lower_train(run, settings, batch, rl.micro_batches)
        compiled["train"] = compile_memory("train step", lowered, top)
    if "score" in programs:
        lowered = plan_programs.lower_score(run, batch, rl.micro_batches)
        compiled["score"] = compile_memory("score (policy + reference log-probs)", lowered, top)
    if "sample" in programs:
        lowered = plan_programs.lower_sample(run, plan_programs.sampling_params(rl, model), b_prompts, prompt_len)
        compiled["sample"] = compile_memory("sampler (prefill + decode loop)", lowered, top)

    p_bytes, ref_bytes = sharded_bytes(run.params), sharded_bytes(run.frozen)
    opt_bytes = sharded_bytes(run.state) - p_bytes
    snap_bytes = rl.async_level * (p_bytes * model.jnp_frozen_dtype.itemsize // 4 if lora_on
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
    chunk_prompts = b_prompts // num_chunks(b_prompts, rl.sampler_chunk)
    kv = cache_bytes(model, -(-chunk_prompts * g // data_shards), seq - 1)
    bound = None
    if roofline and chip is not None:
        costs, _ = plan_cost.step_costs(model, settings, mesh, programs)
        head_shared = model.tie_embeddings  # the embedding lookup is no matmul; a tied head is the embedding
        matmul = num_params(model) - (0 if head_shared else model.vocab_size * model.hidden_size)
        flops = model_flops(matmul, b_prompts, g, prompt_len, resp, score_forwards=2, lora=lora_on)
        bound = Roofline(chip.name, want, chip.peak_flops, chip.hbm_bytes_per_s, costs, rows * seq,
                         sum(v for k, v in flops.items() if k in costs))
    return Plan(
        model=name, num_params=num_params(model), mesh=tuple(mesh_shape),
        shapes={"prompts": b_prompts, "group": g, "sequences": rows, "prompt_len": prompt_len,
                "new_tokens": resp, "micro_batches": rl.micro_batches, "async_level": rl.async_level,
                "sampler_chunk": chunk_prompts},
        dtypes={"param_dtype": model.param_dtype, "dtype": model.dtype, "remat": model.remat,
                "kernels": "cpu" if model.cpu_kernels else "plain"},
        lora=None if not lora_on else {"rank": model.lora.rank, "alpha": model.lora.alpha,
                                       "targets": list(model.lora.targets), "adapter_params": lora.count(model),
                                       "reference_copy_saved": ref_bytes},
        params=p_bytes, opt_state=opt_bytes, ref_params=ref_bytes, snapshots=snap_bytes, kv_cache=kv,
        programs=compiled, phases=phases, chip=chip, compiler=compiler_name(devices), roofline=bound,
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
        f"  compiled by {plan.compiler}",
        f"  batch: {s['prompts']} prompts x {s['group']} samples = {s['sequences']} sequences of "
        f"{s['prompt_len']} + {s['new_tokens']} tokens, {s['micro_batches']} micro-batch(es), sampler chunks of "
        f"{s['sampler_chunk']} prompts; "
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
        lines.insert(3, f"  LoRA rank {plan.lora['rank']} (alpha {plan.lora['alpha']:g}) on "
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
    if plan.roofline is not None:
        lines += format_roofline(plan.roofline)
    if plan.compiler.startswith("TPU"):
        lines.append("Temporaries come from the TPU compiler's programs for this slice. Parameters, optimizer "
                     "state and KV cache are exact.")
    else:
        lines.append("Temporaries come from the CPU's compilations (XLA:CPU) of the same programs, upper bounds: a "
                     "TPU/GPU compiler schedules and fuses differently and makes no float32 copies of bfloat16 "
                     "weights. Parameters, optimizer state and KV cache are exact.")
    return "\n".join(lines)


def format_roofline(r: Roofline) -> list[str]:
    """The roofline lines of a plan."""
    secs = r.phase_seconds()
    parts = ", ".join(f"{k} {v:.3g} s ({r.phases[k].flops / 1e12:.3g} TFLOP, {r.phases[k].bytes / 1e9:.3g} GB)"
                      for k, v in secs.items())
    return [f"step time >= {r.step_seconds:.3g} s (roofline: {r.chip} at {r.peak_flops / 1e12:.0f} TFLOP/s bf16, "
            f"{r.hbm_bytes_per_s / 1e9:.0f} GB/s HBM per device)",
            f"  per device: {parts}",
            f"  <= {r.tokens_per_s_per_chip:,.0f} tokens/s per chip ({r.tokens} sequence tokens a step), "
            f"MFU ceiling {100 * r.mfu_ceiling:.3g}%"]


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, default=str)
