"""`kljax train --config configs/NAME.py --workdir DIR [--resume] [--config.field=value ...]`.

Multi-host: the same command on every host, with `--coordinator HOST:PORT --num-processes N
--process-id I` (or KLJAX_COORDINATOR / KLJAX_NUM_PROCESSES / KLJAX_PROCESS_ID); on TPU VM pods and
under SLURM no flags are needed (see `kljax.parallel.distributed`).
"""

from __future__ import annotations

import argparse
import json
import sys

ACCEPTS_CONFIG_OVERRIDES = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="a config: a .py file with get_config(), or a .yaml/.json file of the fields to change "
                             "(nested or dotted), or a run's config.json (default: configs/default.py, SmolLM2 on "
                             "arithmetic)")
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
    from kljax.api import RLTrainer
    from kljax.parallel import distributed
    from kljax.train.trainer import NonFiniteError

    try:
        # The Python API's path: the same config resolution, build and loop as kljax.RLTrainer
        trainer = RLTrainer(config=args.config, overrides=getattr(args, "overrides", []), workdir=args.workdir,
                            resume=args.resume or False, progress=not args.no_progress)
        if distributed.initialize(distributed.options_from(
            getattr(args, "coordinator", None), getattr(args, "num_processes", None), getattr(args, "process_id", None)
        )):
            distributed.quiet_unless_main()
        result = trainer.train(stop_after=args.stop_after)
        summary = {"before": result.eval_before, "after": result.eval_after, "exact": result.exact,
                   **({"stopped_at": result.stopped_at} if result.stopped_at is not None else {})}
    except ValueError as e:
        if getattr(args, "debug", False):
            raise
        from kljax.errors import UserError
        from kljax.train.io_errors import disk_fault_message

        print(f"kljax train: error: {(not isinstance(e, UserError) and disk_fault_message(e)) or e}",
              file=sys.stderr)
        return 2
    except NonFiniteError as e:  # the run failed (exit 1), not its input
        if getattr(args, "debug", False):
            raise
        print(f"kljax train: error: {e}", file=sys.stderr)
        return 1
    if not distributed.is_main_process():
        return 0
    if "stopped_at" in summary:
        print(f"stopped after step {summary['stopped_at']}; continue with --resume")
        return 0
    if summary["after"]:  # before, after and the paired change, with 95% intervals (kljax.train.eval_table)
        from kljax.train.eval_table import change_table, kl_line

        print("evaluation before -> after (greedy, and the policy trained: samples at rl.temperature):")
        print("\n".join(change_table(summary["before"], summary["after"])))
        kl = kl_line(result.metrics)
        if kl:
            print(kl)
    exact = summary.get("exact")
    if exact:  # a task with an exact optimum (toy_optimum)
        print(f"exact gap to pi* (beta KL(pi || pi*)): {exact['before']:.4g} -> {exact['after']:.4g}")
    from kljax.train.run_outputs import output_lines

    print("\n".join(output_lines(args.workdir)))  # where the outputs are, and the next commands to try
    from kljax.train.eval_table import brief

    print(json.dumps({"workdir": str(args.workdir), "after": brief(summary["after"]),
                      **({"exact_gap": exact} if exact else {})}))
    return 0
