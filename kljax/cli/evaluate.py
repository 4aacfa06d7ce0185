"""`kljax eval`: greedy accuracy, mean@k and unbiased pass@k of a model on task splits.

    kljax eval --model tiny|default|DIR --tasks arithmetic:test,arithmetic:ood_digits [--k 4] [--json PATH]
    kljax eval --checkpoint WORKDIR [--step S] [--tasks ...] [--n-examples N] [--config.rl.temperature=0.7]

Settings (prompt format, buffers, temperature, number of examples, seed) come from the run config:
WORKDIR/config.json for --checkpoint, else --config FILE (default: configs/tiny.py for --model tiny,
the default run otherwise); flags and `--config.field=value` overrides change them. See
`kljax.studies.evaluate` for the estimators.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import jax

from kljax.boundary.disk_faults import disk_fault_message
from kljax.config.load import CONFIGS_DIR, load_run_config, with_overrides
from kljax.config.run import RunConfig
from kljax.config.sections import MODEL_SOURCES
from kljax.errors import UserError
from kljax.studies import evaluate as ev
from kljax.studies.eval_tasks import splits_for
from kljax.train.restore import load_model, make_mesh, restore_params, run_config_of
from kljax.train.run_build import enable_compilation_cache
from kljax.train.run_logs import dumps
from kljax.util.owned_paths import WRITTEN_BY, check_output, check_writable

ACCEPTS_CONFIG_OVERRIDES = True


def count(text: str) -> int:
    """An integer, also written as a whole number in float notation ("1e4" -> 10000)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def configure(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="'tiny', 'default' (SmolLM2-135M-Instruct) or a HF checkpoint directory")
    source.add_argument("--checkpoint", metavar="WORKDIR", help="a `kljax train` workdir (its latest checkpoint)")
    parser.add_argument("--step", type=int, default=None, help="with --checkpoint: this step instead of the latest")
    parser.add_argument("--config", default=None, help="run config file for the settings (see the description)")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated name:split specs (default: the config's task and eval_splits)")
    parser.add_argument("--k", type=int, default=None,
                        help="k of pass@k and mean@k (default: the run's eval_samples, 2 for the default run; 4 if 0)")
    parser.add_argument("--n-samples", type=int, default=None, help="samples per prompt, >= k (default k)")
    parser.add_argument("--n-examples", type=count, default=None,
                        help="examples per split (default eval_examples; 1e4 = 10000)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default rl.temperature)")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per sampler call")
    parser.add_argument("--prompt-format", choices=["chat", "plain", "raw"], default=None)
    parser.add_argument("--seed", type=int, default=None, help="examples and sampling seed (default config.seed)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON here")
    parser.add_argument("--overwrite", action="store_true", help="replace a --json file that kljax did not write")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _base_config(args: argparse.Namespace) -> RunConfig:
    if args.config:
        return load_run_config(args.config)
    tiny = CONFIGS_DIR / "tiny.py"
    return load_run_config(tiny if args.model == "tiny" and tiny.is_file() else None)


def run(args: argparse.Namespace) -> int:
    if args.json and Path(args.json).is_dir():
        raise UserError(f"--json {args.json} is a directory; give a file path")
    if args.json:  # before the evaluation, not after it: never over the run it reads, nor a user's file
        check_output(args.json, "--json", overwrite=args.overwrite, reads=[args.checkpoint] if args.checkpoint else [])
        check_writable(args.json, "--json")
    enable_compilation_cache()
    overrides = list(getattr(args, "overrides", []))
    if args.checkpoint:
        config = run_config_of(args.checkpoint, overrides)
    else:
        if args.model not in MODEL_SOURCES and not Path(args.model).is_dir():
            raise UserError(f"--model {args.model!r} is neither 'tiny', 'default' nor a directory")
        config = with_overrides(_base_config(args), [*overrides, f"--config.model.source={args.model}"])
    settings = ev.EvalSettings.from_run_config(
        config, k=args.k, n_samples=args.n_samples, n_examples=args.n_examples, temperature=args.temperature,
        batch_size=args.batch_size, prompt_format=args.prompt_format, seed=args.seed,
    )
    splits = splits_for(config, args.tasks)  # the run's own task (file tasks too) or name:split specs
    ev.check_memory(splits, settings)  # before the model loads or an example is made
    if args.checkpoint:
        params, policy, config, step = restore_params(args.checkpoint, args.step, overrides=overrides)
        mesh = jax.tree.leaves(params)[0].sharding.mesh  # the mesh the checkpoint was restored onto
        source = {"checkpoint": str(args.checkpoint), "step": step, "model": config.model.source}
        train_task = config.task.name
    else:
        mesh = make_mesh(config)
        policy = load_model(config, mesh)
        params = policy.params
        source = {"model": args.model}
        train_task = None
    results = ev.evaluate(policy, params, splits, settings, mesh, train_task=train_task,
                          progress=not args.no_progress)
    print(ev.format_table(results))
    summary = ev.summarize(results)
    if args.json:
        used = {**dataclasses.asdict(settings), "n_samples": settings.samples}
        payload = {WRITTEN_BY: "kljax eval", **source, "settings": used, "summary": summary, "results": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        try:
            Path(args.json).write_text(dumps(payload, indent=2))  # strict JSON: null, never NaN
        except OSError as e:  # a full or read-only disk: name the file (a failed write() names none)
            message = disk_fault_message(e, f"--json {args.json}")
            if message is None:
                raise
            raise UserError(message) from e
        print(f"wrote {args.json}")
    return 0
