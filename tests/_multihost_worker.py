"""One process of a (multi-process) tiny training run, for tests/test_multihost.py.

    python tests/_multihost_worker.py --devices 1 --coordinator localhost:PORT --num-processes 2 \
        --process-id 0 --workdir DIR --steps 5 --stop-after 3 --fsdp 2 --dump params.npz

Sets the simulated CPU device count before JAX starts, joins the runtime through
`kljax.parallel.distributed.initialize` (the function `kljax train` calls), runs `kljax.train.trainer.train`
on the tiny config and, on process 0, writes the final parameters (gathered) to --dump.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--num-processes", type=int, default=None)
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--fsdp", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dump", default=None)
    parser.add_argument("--no-eval", action="store_true", help="skip the before/after evaluations")
    args = parser.parse_args(argv)

    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, str(REPO))
    sys.modules["tensorboardX"] = None  # metrics.jsonl is the record; skip importing torch (seconds per worker)

    import jax
    import numpy as np

    from kljax.config import load_run_config
    from kljax.parallel import distributed
    from kljax.train.trainer import train

    options = distributed.options_from(args.coordinator, args.num_processes, args.process_id)
    if options.explicit:
        options = distributed.DistributedOptions(options.coordinator, options.num_processes, options.process_id,
                                                 initialization_timeout=60)
        assert distributed.initialize(options)
    overrides = {"mesh.data": 1, "mesh.fsdp": args.fsdp, "mesh.tensor": 1, "steps": args.steps,
                 "checkpoint_every": 100, "eval_examples": 8}
    if args.no_eval:
        overrides["task.eval_splits"] = ""
    config = load_run_config((REPO / "configs" / "tiny.py"),
                             [f"--config.{k}={v}" for k, v in overrides.items()])
    summary = train(config, args.workdir, resume=args.resume, progress=False, stop_after=args.stop_after)
    flat = jax.tree_util.tree_flatten_with_path(distributed.gather(summary["params"]))[0]
    arrays = {jax.tree_util.keystr(path): leaf for path, leaf in flat}
    if args.dump and jax.process_index() == 0:
        np.savez(args.dump, **arrays)
    print(f"worker {jax.process_index()}/{jax.process_count()} done on {jax.device_count()} devices", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
