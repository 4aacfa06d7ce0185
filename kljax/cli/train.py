"""`kljax train --config configs/NAME.py --workdir DIR [--resume] [--config.field=value ...]`.

Multi-host: the same command on every host, with `--coordinator HOST:PORT --num-processes N
--process-id I` (or KLJAX_COORDINATOR / KLJAX_NUM_PROCESSES / KLJAX_PROCESS_ID); on TPU VM pods and
under SLURM no flags are needed (see `kljax.parallel.distributed`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kljax.api import RLTrainer
from kljax.errors import UserError
from kljax.parallel import distributed
from kljax.train.eval_table import brief, change_table, kl_line
from kljax.train.run_outputs import output_lines
from kljax.train.trainer import NonFiniteError

ACCEPTS_CONFIG_OVERRIDES = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="a config: a .py file with get_config(), or a .yaml/.json file of the fields to change "
                             "(nested or dotted) over the default run (SmolLM2 on arithmetic); with --resume, "
                             "default: WORKDIR/config.json")
    parser.add_argument("--workdir", required=True, help="directory for checkpoints, metrics and evaluations")
    parser.add_argument("--resume", nargs="?", const="latest", default=None, choices=["latest", "auto", "strict"],
                        help="continue from the newest intact checkpoint in --workdir (none: an error); "
                             "--resume=auto starts a new run when there is none; --resume=strict refuses a "
                             "damaged latest checkpoint instead of falling back to an older one")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="stop (after checkpointing) once this many steps ran in this invocation")
    group = parser.add_argument_group("multi-host (one process per host; all flags or none)")
    group.add_argument("--coordinator", default=None, help="HOST:PORT of process 0 (env KLJAX_COORDINATOR)")
    group.add_argument("--num-processes", type=int, default=None, help="number of processes (env KLJAX_NUM_PROCESSES)")
    group.add_argument("--process-id", type=int, default=None, help="this process, 0..N-1 (env KLJAX_PROCESS_ID)")
    parser.epilog = ("Any config field can be overridden, e.g. --config.kl.estimator=k3 --config.kl.placement=loss "
                     "--config.steps=50; run `kljax kl-configs` for the KL configurations. "
                     "configs/toy_tabular.py trains on a toy task with a known optimum and logs the exact gap "
                     "to it every step (exact/gap in metrics.jsonl).")


def run(args: argparse.Namespace) -> int:
    if args.stop_after is not None and args.stop_after < 1:
        raise UserError(f"--stop-after={args.stop_after} must be an integer >= 1 (steps to run in this invocation)")
    if not args.workdir.strip():
        raise UserError("--workdir '' is empty; give a directory for the run's files")
    overrides = getattr(args, "overrides", [])
    options = distributed.options_from(args.coordinator, args.num_processes, args.process_id)
    config_path = args.config
    if config_path is None and args.resume:  # resume the run as it was recorded
        recorded = Path(args.workdir) / "config.json"
        config_path = str(recorded) if recorded.is_file() else None
    # The Python API's path: the same config resolution, build and loop as kljax.RLTrainer
    trainer = RLTrainer(config=config_path, overrides=overrides, workdir=args.workdir, resume=args.resume or False,
                        progress=not args.no_progress)
    if distributed.initialize(options):
        distributed.quiet_unless_main()
    try:
        result = trainer.train(stop_after=args.stop_after)
    except NonFiniteError as e:  # the run failed (exit 1), not its input
        if args.debug:
            raise
        print(f"kljax train: error: {e}", file=sys.stderr)
        return 1
    if not distributed.is_main_process():
        return 0
    if result.stopped_at is not None:
        print(f"stopped after step {result.stopped_at}; continue with --resume")
        return 0
    if result.eval_after:  # before, after and the paired change, with 95% intervals (kljax.train.eval_table)
        print("evaluation before -> after (greedy, and the policy trained: samples at rl.temperature):")
        print("\n".join(change_table(result.eval_before, result.eval_after)))
        kl = kl_line(result.metrics)
        if kl:
            print(kl)
    if result.exact:  # a task with an exact optimum (toy_optimum)
        print(f"exact gap to pi* (beta KL(pi || pi*)): {result.exact['before']:.4g} -> {result.exact['after']:.4g}")
    print("\n".join(output_lines(args.workdir)))  # where the outputs are, and the next commands to try
    print(json.dumps({"workdir": str(args.workdir), "after": brief(result.eval_after),
                      **({"exact_gap": result.exact} if result.exact else {})}))
    return 0
