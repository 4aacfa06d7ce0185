"""Pieces every `kljax bench` benchmark shares: timing statistics, the machine's matmul peak,
compile-time capture, model loading (HF dir, the embedded default, or `random:NAME`), JSON output.

Speeds are `units / seconds` over repeated timed runs, reported as the median with min/max and
quartiles. MFU = achieved model FLOP/s / peak FLOP/s, where the peak is measured in the same run
by `measure_matmul_peak` (a jitted [n, n] @ [n, n] jnp.dot in the run's dtype, accumulated in
float32, 2 n^3 FLOPs) unless the caller gives a
chip's datasheet number.

`--model random:NAME[:field=value,...]` builds a random-init model from the HF config.json dict
`kljax.models.known_configs.KNOWN_CONFIGS[NAME]`, optionally with fields overridden (e.g.
`random:qwen2.5-0.5b:num_hidden_layers=2,vocab_size=512` for a smoke test). kljax initializes the
weights; when a peer needs them they are exported (`convert.export_hf`) to a temporary HF
checkpoint that the peer loads, so both sides run identical weights.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RANDOM_PREFIX = "random:"
Timing = tuple[float, float]  # (wall seconds, process CPU seconds) of one timed run


def timed(fn: Callable[[], Any]) -> Timing:
    """Run fn() once; (wall seconds, process CPU seconds). fn must block until its work is done."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def kernel_usage(fn: Callable[[], Any], runs: int) -> dict[str, float]:
    """Run fn() `runs` times; the process's kernel CPU seconds and page faults per run while it
    did (getrusage). High kernel time with many minor faults means the runs spend their time
    faulting in fresh memory (on VMs that hand freed memory back to the host, much slower than
    compute): the figure that says whether a speed measures the code or the machine's memory."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(runs):
        fn()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"sys_s_per_run": round((after.ru_stime - before.ru_stime) / runs, 3),
            "minor_faults_per_run": round((after.ru_minflt - before.ru_minflt) / runs),
            "major_faults_per_run": round((after.ru_majflt - before.ru_majflt) / runs)}


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """fn() once untimed (compile + warm-up), then the median wall seconds of `repeats` timed calls.
    fn must block until its work is done."""
    fn()
    return statistics.median(timed(fn)[0] for _ in range(repeats))


def normal_init(dtype: Any, seed: int = 0, std: float = 0.02) -> Callable[[tuple[int, ...]], Any]:
    """shape -> a fresh N(0, std^2) array in `dtype` (drawn in float32), a new key each call."""
    import jax
    import jax.numpy as jnp

    counter = itertools.count()
    base = jax.random.key(seed)
    return lambda shape: (jax.random.normal(jax.random.fold_in(base, next(counter)), shape, jnp.float32)
                          * std).astype(dtype)


def check_peak_gflops(value: float | None) -> None:
    """--peak-gflops, when given, must be a positive number."""
    if value is not None and not value > 0:
        raise ValueError(f"--peak-gflops must be > 0, got {value}")


def throughput(units: float, timings: Sequence[Timing]) -> dict[str, Any]:
    """Median and spread of units/s over runs that each did `units` of work.

    Returns tokens_per_s (the median), min, max, q1, q3 (inclusive quartiles) of units/s, the raw
    wall and CPU seconds, and the median CPU seconds per unit.
    """
    if not timings:
        raise ValueError("throughput needs at least one timed run")
    seconds = [wall for wall, _ in timings]
    speeds = sorted(units / s for s in seconds)
    quartiles = statistics.quantiles(speeds, n=4, method="inclusive") if len(speeds) > 1 else [speeds[0]] * 3
    return {
        "tokens_per_s": statistics.median(speeds),
        "min": speeds[0], "max": speeds[-1], "q1": quartiles[0], "q3": quartiles[2],
        "seconds": [round(s, 4) for s in seconds],
        "cpu_seconds": [round(c, 4) for _, c in timings],
        "cpu_seconds_per_token": statistics.median(c for _, c in timings) / units,
    }


def geomean(values: Sequence[float]) -> float:
    """exp(mean(log v)) of positive values."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def parse_subset(value: str, allowed: Sequence[str], flag: str) -> list[str]:
    """A comma-separated, non-empty subset of `allowed` (e.g. --modes, --cases); ValueError naming the
    flag, the bad value and the valid ones otherwise."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or any(v not in allowed for v in items):
        raise ValueError(f"{flag} must be a comma-separated subset of {','.join(allowed)}; got {value!r}")
    return items


def check_counts(args: Any, positive: Sequence[str], non_negative: Sequence[str] = ("warmup",)) -> None:
    """Raise ValueError naming the flag and its value for a count that is out of range."""
    for name in positive:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in non_negative:
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")


def versions() -> dict[str, str]:
    """Installed versions of the packages a benchmark compares."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("jax", "jaxlib", "optax", "torch", "transformers", "trl"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def peak_rss_mb() -> float:
    """Peak resident memory of this process, MiB: VmHWM from /proc/self/status (which
    `reset_peak_rss` can reset), else ru_maxrss (KiB on Linux, bytes on macOS; since the start)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10
    except (OSError, ValueError, IndexError):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if platform.system() == "Darwin" else 2**10)


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def machine_info(load_before: tuple[float, float, float] | None = None) -> dict[str, Any]:
    """Cores, platform, JAX backend and device kind, load averages (before the run and now), and the
    glibc tunables both sides ran under (`kljax.util.hostmem`)."""
    import jax

    device = jax.devices()[0]
    return {
        "cpu_count": os.cpu_count() or 1, "platform": platform.platform(), "jax_backend": jax.default_backend(),
        "device_kind": getattr(device, "device_kind", str(device)),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "peak_rss_mb": round(peak_rss_mb(), 1),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
    }


def write_json(path: str | os.PathLike | None, result: dict[str, Any]) -> None:
    """Write `result` as indented JSON to `path` (parents created); nothing when path is None."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


class CompileTimer:
    """Sums XLA backend compile seconds as JAX reports them (`/jax/core/compile/backend_compile_duration`).

    `mark()` returns a position; `since(mark)` the compile seconds after it.
    """

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        import jax

        self._seconds: list[float] = []
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_: Any) -> None:
        if event == self.EVENT:
            self._seconds.append(duration)

    def mark(self) -> int:
        return len(self._seconds)

    def since(self, mark: int) -> float:
        return sum(self._seconds[mark:])


def torch_matmul_gflops(dtype: str, threads: int, size: int = 512, repeats: int = 3) -> float:
    """PyTorch's [size, size] @ [size, size] matmul throughput in `dtype` on `threads` threads, GFLOP/s
    (the best of `repeats`): a CPU without native bfloat16 (AVX2 only) runs torch's bfloat16 GEMM
    through a slow fallback, tens of times below its float32 one."""
    import torch

    torch.set_num_threads(threads)
    a, b = (torch.randn(size, size).to(getattr(torch, dtype)) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def measure_matmul_peak(dtype: str = "float32", size: int | None = None, repeats: int = 5, inner: int | None = None
                        ) -> dict[str, Any]:
    """Measured matmul throughput in GFLOP/s: a jitted [size, size] @ [size, size] jnp.dot.

    Each timed repeat dispatches `inner` products and waits for the last (2 size^3 FLOPs each); the
    median over `repeats` (after one compile + warm-up call) is returned as `gflops`. Defaults:
    size 2048 and inner 1 on CPU, size 8192 and inner 20 on accelerators.
    """
    import jax
    import jax.numpy as jnp

    cpu = jax.default_backend() == "cpu"
    size = size or (2048 if cpu else 8192)
    inner = inner or (1 if cpu else 20)
    if size < 1 or repeats < 1 or inner < 1:
        raise ValueError(f"matmul peak needs size, repeats, inner >= 1; got {size}, {repeats}, {inner}")
    keys = jax.random.split(jax.random.key(0))
    a, b = (jax.random.normal(k, (size, size), jnp.float32).astype(dtype) for k in keys)
    # 16-bit inputs accumulate in float32, as the model's dots do (what selects XLA CPU's bf16 kernels)
    dot = jax.jit(functools.partial(jnp.dot, preferred_element_type=jnp.float32))
    dot(a, b).block_until_ready()

    def once() -> None:
        out = None
        for _ in range(inner):
            out = dot(a, b)
        out.block_until_ready()

    seconds = sorted(timed(once)[0] for _ in range(repeats))
    flops = 2.0 * size**3 * inner
    return {"gflops": flops / statistics.median(seconds) / 1e9, "dtype": dtype, "size": size, "inner": inner,
            "max_gflops": flops / seconds[0] / 1e9}


def peak_gflops(override: float | None, dtype: str) -> dict[str, Any]:
    """The MFU denominator: `override` (a datasheet number) if given, else measured now."""
    if override is not None:
        check_peak_gflops(override)
        return {"gflops": float(override), "source": "--peak-gflops"}
    # In the run's own dtype. Before 2026-12-01 CPU runs were measured against float32, on the
    # premise that XLA CPU has no fast bfloat16 matmul; with float32 accumulation (as the model's
    # dots) a 2048^3 bfloat16 dot runs at ~1.5 TFLOP/s on a Xeon with AMX, 5x its float32 rate, so
    # a bfloat16 update's MFU against the float32 peak exceeded 1.
    measured = measure_matmul_peak(dtype)
    return {**measured, "source": f"measured: jitted {dtype} jnp.dot, {measured['size']}^3"}


# ------------------------------------------------------------------------------------------- models


@dataclasses.dataclass
class BenchModel:
    """Parameters and config on the kljax side; `hf_dir` a HF checkpoint of the same weights (None
    when a random-init model was not exported because no peer needs it); `name` for reports."""

    params: Any
    config: Any
    hf_dir: Path | None
    name: str


def parse_random_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """'random:NAME[:field=value,...]' -> (NAME, HF config.json dict with the overrides applied)."""
    from kljax.models.known_configs import KNOWN_CONFIGS

    body = spec[len(RANDOM_PREFIX):]
    name, _, overrides = body.partition(":")
    if name not in KNOWN_CONFIGS:
        raise ValueError(f"--model {spec!r}: unknown config {name!r}; known: "
                         + ", ".join(RANDOM_PREFIX + k for k in KNOWN_CONFIGS))
    hf = dict(KNOWN_CONFIGS[name])
    for item in filter(None, overrides.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in hf and key != "head_dim":
            raise ValueError(f"--model {spec!r}: override {item!r} must be FIELD=VALUE with FIELD one of "
                             f"{sorted(hf)}")
        hf[key] = json.loads(value)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids a shrunken vocabulary lost
        if key not in overrides and isinstance(hf.get(key), int) and hf[key] >= hf["vocab_size"]:
            hf[key] = None
    return name, hf


def load_model(spec: str | None, *, export_for_peer: bool, mesh: Any = None, seed: int = 0,
               **runtime: Any) -> BenchModel:
    """Load `--model`: an HF checkpoint dir, None for the embedded SmolLM2-135M-Instruct, or
    `random:NAME[:overrides]` (see the module docstring). `runtime`: ModelConfig run-time fields
    (param_dtype, dtype, remat, scan_layers). With a `mesh`, parameters land in their shardings.
    """
    from kljax.models.convert import load_hf_checkpoint

    if spec is None or not spec.startswith(RANDOM_PREFIX):
        if spec is None:
            from kljax.models.default import default_model_dir

            model_dir = default_model_dir()
        else:
            model_dir = Path(spec)
            if not (model_dir / "config.json").is_file():
                raise ValueError(f"--model {spec!r} is neither an HF checkpoint directory (no config.json) nor "
                                 f"{RANDOM_PREFIX}NAME")
        params, config = load_hf_checkpoint(model_dir, mesh=mesh, **runtime)
        return BenchModel(params, config, model_dir, str(model_dir))

    import jax

    from kljax.models import transformer as tfm
    from kljax.models.config import ModelConfig
    from kljax.models.convert import export_hf
    from kljax.parallel import sharding as shd

    name, hf = parse_random_spec(spec)
    config = ModelConfig.from_hf(hf, **runtime)
    shardings = None if mesh is None else shd.logical_to_sharding(
        tfm.logical_axes(config), tfm.param_shapes(config), mesh)
    params = jax.jit(lambda: tfm.init_params(config, jax.random.key(seed)), out_shardings=shardings)()
    hf_dir = None
    if export_for_peer:
        hf_dir = Path(tempfile.mkdtemp(prefix=f"kljax-bench-{name}-")) / "model"
        atexit.register(shutil.rmtree, hf_dir.parent, ignore_errors=True)
        export_hf(params, config, hf_dir, hf_config=hf)
    return BenchModel(params, config, hf_dir, spec)


def layer_matmul_shapes(config: Any) -> list[tuple[int, int]]:
    """(out, in) of one layer's weight matmuls: fused q/k/v, output, fused gate/up, down."""
    d, dh, f = config.hidden_size, config.head_dim, config.intermediate_size
    return [((config.num_heads + 2 * config.num_kv_heads) * dh, d), (d, config.num_heads * dh), (2 * f, d), (d, f)]


def body_and_head_params(n_total: int, vocab_size: int, hidden_size: int, tied: bool) -> tuple[int, int]:
    """(N, H): the non-embedding parameters and the output head's V * D, from the parameter count."""
    head = vocab_size * hidden_size
    return n_total - head * (1 if tied else 2), head


def sample_flops(n_body: float, n_head: float, prompt_tokens: float, generated_tokens: float) -> float:
    """Model FLOPs of generating: 2 N (P + T) + 2 H T for P prompt tokens run through the body once
    (prefill) and T generated tokens, each needing the body and the head's logits. N non-embedding
    parameters, H = V * D the head; norms, attention scores and sampling are left out."""
    return 2 * n_body * (prompt_tokens + generated_tokens) + 2 * n_head * generated_tokens


def train_flops(config: Any, batch: int, seq_len: int, response_len: int) -> dict[str, float]:
    """Model FLOPs of one policy update (forward + backward) on batch x seq_len tokens.

        matmul    = 6 * N * B * S,  N = L * (D Dh (2 H + 2 Kv) + 3 D F)  (non-embedding matmul weights)
        attention = 12 * L * H * Dh * S * B * S  (Q K^T and P V, full S x S as in PaLM's MFU)
        lm_head   = 6 * D * V * B * R            (the unembedding, at the R response positions only)
    Norms, biases, rotary, softmax and the optimizer's elementwise work are not counted.
    """
    c = config
    n = c.num_layers * (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
                        + 3 * c.hidden_size * c.intermediate_size)
    tokens = batch * seq_len
    out = {
        "matmul": 6.0 * n * tokens,
        "attention": 12.0 * c.num_layers * c.num_heads * c.head_dim * seq_len * tokens,
        "lm_head": 6.0 * c.hidden_size * c.vocab_size * batch * response_len,
        "non_embedding_params": float(n),
    }
    out["total"] = out["matmul"] + out["attention"] + out["lm_head"]
    return out


def add_run_flags(parser: Any) -> None:
    """The flags every benchmark shares: --no-peer, --seed and --json PATH (as args.json_path)."""
    parser.add_argument("--no-peer", action="store_true", help="time kljax only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", help="write the results here")
