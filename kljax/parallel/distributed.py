"""Multi-host runs on JAX's own multi-controller runtime: one process per host, one global mesh.

    kljax train ... --coordinator HOST:PORT --num-processes N --process-id I   (explicit)
    KLJAX_COORDINATOR=HOST:PORT KLJAX_NUM_PROCESSES=N KLJAX_PROCESS_ID=I kljax train ...
    kljax train ...        on a TPU VM pod, under SLURM or Open MPI: `jax.distributed.initialize()`
                           finds the cluster itself (set KLJAX_DISTRIBUTED=off to stay single-process)

Every process runs the same program. The mesh spans `jax.devices()` (all hosts); jitted functions
take and return global `jax.Array`s. Host data enters the mesh either as the same array on every
process (`kljax.parallel.sharding.device_put_host`: each process copies only its own shards) or as each
process's own rows (`global_from_local_rows`). `local_rows` is the way back: the rows of a
batch-sharded global array that live on this process, e.g. to compute rewards on the samples this
host drew. Checkpoints are written by all processes together (orbax); logs and metrics by process 0.

It also checks a mesh shape against the devices, the batch and the heads first, listing shapes that fit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kljax.parallel.sharding import resolve_mesh_shape

log = logging.getLogger(__name__)

ENV_COORDINATOR = "KLJAX_COORDINATOR"
ENV_NUM_PROCESSES = "KLJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "KLJAX_PROCESS_ID"
ENV_MODE = "KLJAX_DISTRIBUTED"  # "auto" (default), "on" (always initialize()), "off"


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """How to join the multi-controller runtime. All None: detect the cluster (or run alone)."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    initialization_timeout: int | None = None

    @property
    def explicit(self) -> bool:
        return any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))

    def validate(self) -> None:
        """Raise ValueError unless the options are all given (and consistent) or all absent."""
        if not self.explicit:
            return
        missing = [n for n, v in (("--coordinator", self.coordinator), ("--num-processes", self.num_processes),
                                  ("--process-id", self.process_id)) if v is None]
        if missing:
            raise ValueError(
                f"multi-host needs --coordinator, --num-processes and --process-id together (or "
                f"{ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}); missing {missing}"
            )
        host, sep, port = str(self.coordinator).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--coordinator={self.coordinator!r} must look like HOST:PORT")
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"--process-id={self.process_id} must be in [0, --num-processes={self.num_processes})"
            )


def options_from(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
                 env: Mapping[str, str] | None = None) -> DistributedOptions:
    """Flags first, then KLJAX_COORDINATOR / KLJAX_NUM_PROCESSES / KLJAX_PROCESS_ID."""
    env = os.environ if env is None else env

    def pick(flag: Any, name: str, cast: type) -> Any:
        if flag is not None:
            return cast(flag)
        value = env.get(name, "").strip()
        return cast(value) if value else None

    options = DistributedOptions(pick(coordinator, ENV_COORDINATOR, str), pick(num_processes, ENV_NUM_PROCESSES, int),
                                 pick(process_id, ENV_PROCESS_ID, int))
    options.validate()
    return options


def detected_cluster(env: Mapping[str, str] | None = None) -> str | None:
    """The cluster `jax.distributed.initialize()` can configure itself on, if this looks like one.

    TPU VM (a pod slice's workers, or GKE), SLURM with more than one task, Open MPI; None otherwise.
    """
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID") and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1) > 1:
        return "slurm"
    if env.get("OMPI_MCA_orte_hnp_uri") or int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return "openmpi"
    if env.get("TPU_WORKER_HOSTNAMES") or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    if env is os.environ and _tpu_chips() > 0:
        return "tpu"  # a Cloud TPU VM: JAX reads the worker list from the metadata server
    return None


def _tpu_chips() -> int:
    """TPU chips on this host's PCI bus (JAX's own probe; /dev/accel* as a fallback)."""
    try:
        from jax._src import hardware_utils

        return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
    except Exception:  # a private helper: if it moves, fall back to the device nodes
        return len(list(Path("/dev").glob("accel[0-9]*")))


_initialized = False


def initialize(options: DistributedOptions | None = None) -> bool:
    """Join the multi-controller runtime if asked to (flags/env) or if a cluster is detected.

    Must run before anything touches a JAX backend. Returns True when this is a multi-process run
    (or the runtime was initialized); idempotent. On CPU the collectives go over gloo.
    """
    global _initialized
    import jax

    options = options or options_from()
    mode = os.environ.get(ENV_MODE, "auto").strip().lower()
    if _initialized:
        return True
    if mode in ("off", "0", "false", "no") and not options.explicit:
        return False
    cluster = None if options.explicit else detected_cluster()
    if not options.explicit and cluster is None and mode not in ("on", "1", "true", "yes"):
        return False
    # Cross-process collectives of the CPU backend (tests, CPU clusters); GPUs and TPUs ignore it.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs: dict[str, Any] = {}
    if options.initialization_timeout is not None:
        kwargs["initialization_timeout"] = options.initialization_timeout
    if options.explicit:
        log.info("joining %d processes at %s as process %d", options.num_processes, options.coordinator,
                 options.process_id)
        jax.distributed.initialize(options.coordinator, options.num_processes, options.process_id, **kwargs)
    else:
        log.info("detected a %s cluster: jax.distributed.initialize()", cluster or "configured")
        jax.distributed.initialize(**kwargs)
    _initialized = True
    return True


def quiet_unless_main() -> None:
    """On processes other than 0, silence Python warnings and INFO/WARNING logs (process 0 reports)."""
    if is_main_process():
        return
    warnings.simplefilter("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging  # orbax logs through absl

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass


def is_main_process() -> bool:
    """Process 0 writes logs, metrics, evaluations and the progress bar."""
    import jax

    return jax.process_index() == 0


# ---------------------------------------------------------------------------------------- host data


def local_rows(array: Any) -> tuple[np.ndarray, np.ndarray]:
    """(global row indices, rows) of a global array's leading axis held by this process, in order.

    Each row appears once even when several local devices (or, on a replicated axis, several
    processes) hold it. On one process this is every row.
    """
    import jax

    if not isinstance(array, jax.Array) or array.is_fully_addressable:
        data = np.asarray(array)
        return np.arange(data.shape[0]), data
    pieces: dict[int, np.ndarray] = {}
    for shard in array.addressable_shards:
        start, stop, _ = shard.index[0].indices(array.shape[0]) if shard.index else (0, array.shape[0], 1)
        if start not in pieces:
            pieces[start] = np.asarray(shard.data)
    starts = sorted(pieces)
    rows = np.concatenate([np.arange(s, s + pieces[s].shape[0]) for s in starts])
    return rows, np.concatenate([pieces[s] for s in starts], axis=0)


def global_from_local_rows(values: np.ndarray, rows: np.ndarray, num_rows: int, sharding: Any) -> Any:
    """A global [num_rows, ...] array from this process's `values` at global `rows`.

    `rows` must cover every row that `sharding` places on this process's devices (as `local_rows`
    of an array with the same leading-axis sharding returns); other rows are never read.
    """
    import jax

    values = np.asarray(values)
    full = np.zeros((num_rows, *values.shape[1:]), values.dtype)
    full[rows] = values
    return jax.make_array_from_callback(full.shape, sharding, lambda index: full[index])


def gather(tree: Any) -> Any:
    """The whole value of every (possibly multi-host) array in `tree` on every process, as numpy.

    All processes must call it together; the arrays that span other hosts are gathered in one
    collective program.
    """
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    spread = [i for i, x in enumerate(leaves)
              if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated]
    out = [np.asarray(x) if i not in spread else None for i, x in enumerate(leaves)]
    if spread:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather([leaves[i] for i in spread], tiled=True)
        for i, value in zip(spread, gathered, strict=True):
            out[i] = np.asarray(value)
    return jax.tree.unflatten(treedef, out)


# ---------------------------------------------------------------------------------------- mesh checks


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fitting_meshes(num_devices: int, batch_sizes: Sequence[int], num_heads: int | None = None) -> list[tuple]:
    """Every (data, fsdp, tensor) using all devices whose data*fsdp divides each batch size and whose
    tensor divides the number of attention heads (when given)."""
    out = []
    for tensor in _divisors(num_devices):
        if num_heads is not None and num_heads % tensor:
            continue
        rest = num_devices // tensor
        for data in _divisors(rest):
            fsdp = rest // data
            if all(b % (data * fsdp) == 0 for b in batch_sizes):
                out.append((data, fsdp, tensor))
    return out


def _suggest(meshes: list[tuple], num_devices: int, batches: Sequence[int], heads: int | None) -> str:
    if not meshes:
        need = f"data*fsdp must divide {sorted(set(batches))}" + (f" and tensor divide {heads} heads" if heads else "")
        return (f"no (data, fsdp, tensor) shape of {num_devices} devices fits ({need}); change the device count "
                "or the batch (rl.prompts_per_step, rl.group_size, rl.micro_batches)")
    # One shape per tensor size, the most fsdp-heavy (the memory-friendly default for 7B-8B models).
    best: dict[int, tuple] = {}
    for d, f, t in sorted(meshes):
        best.setdefault(t, (d, f, t))
    shapes = ", ".join(f"data={d},fsdp={f},tensor={t}" for d, f, t in sorted(best.values(), key=lambda m: m[2]))
    return f"shapes that fit: {shapes} (fsdp may also be traded for data at the same product)"


def check_mesh(mesh_shape: Sequence[int], num_devices: int, rl: Any, model: Any = None) -> tuple[int, int, int]:
    """Resolve a (data, fsdp, tensor) request (one axis may be -1) against the devices, the batch
    and (when `model` is given) the attention heads; raise ValueError listing shapes that fit.

    The sampler shards the rl.prompts_per_step prompts and the train step each micro-batch of
    prompts_per_step * group_size / micro_batches sequences over data*fsdp. The tensor axis splits
    attention heads, so it must divide num_heads; KV heads that it does not divide are replicated
    (a warning: correct, but memory is spent on copies).
    """

    batches = [int(rl.prompts_per_step), int(rl.batch_size) // int(rl.micro_batches)]
    heads = None if model is None else int(model.num_heads)
    suggestion = lambda: _suggest(fitting_meshes(num_devices, batches, heads), num_devices, batches, heads)
    try:
        data, fsdp, tensor = resolve_mesh_shape(*[int(x) for x in mesh_shape], num_devices)
    except ValueError as e:
        raise ValueError(f"{e}; {suggestion()}") from None
    shards = data * fsdp
    problems = []
    if batches[0] % shards:
        problems.append(f"rl.prompts_per_step={batches[0]} does not split over data*fsdp={shards}")
    if batches[1] % shards:
        problems.append(f"each micro-batch of {batches[1]} sequences does not split over data*fsdp={shards}")
    if heads is not None and heads % tensor:
        problems.append(f"tensor={tensor} does not divide the model's {heads} attention heads")
    if problems:
        raise ValueError(
            f"mesh data={data},fsdp={fsdp},tensor={tensor} on {num_devices} devices: " + "; ".join(problems)
            + f"; {suggestion()}"
        )
    if model is not None and int(model.num_kv_heads) % tensor:
        warnings.warn(f"tensor={tensor} does not divide the model's {model.num_kv_heads} KV heads: K/V projections "
                      "and caches are replicated over the tensor axis", stacklevel=2)
    return data, fsdp, tensor


def parse_mesh(text: str, default: Mapping[str, int] | None = None) -> tuple[int, int, int]:
    """'fsdp=64' or 'data=2,fsdp=-1,tensor=4' -> (data, fsdp, tensor); unnamed axes from `default` (else 1)."""
    sizes = {"data": 1, "fsdp": 1, "tensor": 1, **(default or {})}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in ("data", "fsdp", "tensor"):
            raise ValueError(f"mesh {text!r}: each part must be data=N, fsdp=N or tensor=N (N > 0, or -1 once)")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(f"mesh {text!r}: {name}={value!r} is not an integer") from None
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def mesh_devices(mesh_shape: Sequence[int]) -> int | None:
    """Devices a fully specified mesh needs (None when an axis is -1)."""
    return None if -1 in mesh_shape else math.prod(mesh_shape)
