"""The RL training loop: `kljax train --config configs/NAME.py --workdir DIR [--resume]`.

Per step s (0-based): the prompts are `task.examples(split, n, seed=(seed, s))`, so the data
position is the step itself (a file task reads its epoch stream at s * n + an offset, and
checkpoints that position as `data_position`); the sampler uses the parameters of `rl.async_level` steps earlier
(a queue of snapshots, checkpointed with the state); the batch is updated on `rl.updates_per_batch`
times by the jitted `train_step`. With async_level 0 and one update, the importance ratio is 1 up
to float rounding (on-policy). A step is one call of `iteration` (which `kljax bench rl` times too).
Everything a run writes goes under WORKDIR: checkpoints/, metrics.jsonl, tb/, eval_before.json,
eval_after.json, eval_step_N.json (config.eval_every), samples.jsonl (config.log_samples_every),
config.json; the JSON holds null, never NaN (`run_logs`). A task with an exact optimum
(`kljax.tasks.toy_optimum`) also gets its exact metrics in every row (exact/gap, exact/J, ...) and
at pi_ref in exact_before.json.

Multi-host (`kljax.parallel.distributed`): every process runs this loop on the global mesh; checkpoints are
written by all processes together, files and the progress bar by process 0 only.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from kljax.config.run import RunConfig
from kljax.errors import UserError
from kljax.models.base_identity import check_same_base
from kljax.parallel import distributed
from kljax.policies.protocol import frozen_copy
from kljax.rl.kl import adapt_beta
from kljax.tasks.base import Example
from kljax.train import run_logs
from kljax.train import state as st
from kljax.train.checkpoint import RunCheckpointer
from kljax.train.evaluate_loop import before_results, eval_note, evaluate_splits, plan_for_run, with_deltas
from kljax.train.events import LoopObserver, Observers
from kljax.train.metrics import MetricsWriter, read_jsonl, to_python
from kljax.train.resume_check import check_resume_workdir
from kljax.train.reward_set import trainer_state
from kljax.train.rollout import RolloutInfo, rollout
from kljax.train.run_build import Run, build
from kljax.train.step import Batch, batch_kl_metrics
from kljax.train.trl_metrics import resumed_num_tokens, rollout_metrics, trl_kl_logged
from kljax.util.owned_paths import check_claimable, claim_run_dir
from kljax.verdicts.objective import RunObjective, warn_if_biased

PROGRESS_KEYS = ("reward", "accuracy", "kl_seq", "entropy")


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


T = TypeVar("T")


def host_memory_mb() -> float:
    """Resident memory of this process in MiB (Linux /proc; nan elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


def _step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step) % (2**31 - 1)


def _nonfinite_message(n: int, step: int, row: dict[str, float], last: int | None, workdir: Path) -> str:
    kept = f"Last checkpoint: step {last} in {workdir}" if last is not None else "No checkpoint was written"
    rewards = {k: v for k, v in row.items() if (k == "reward" or k.startswith("rewards/") and k.endswith("/mean"))
               and isinstance(v, float) and not math.isfinite(v)}
    if rewards:  # the reward overflowed (e.g. 1e300 is inf in float32): not the learning rate's fault
        shown = ", ".join(f"{k}={v}" for k, v in rewards.items())
        return (f"{n} steps in a row (up to step {step}) had a non-finite reward ({shown}); those updates were "
                f"skipped. {kept}. Fix the reward function: its values must be finite in float32 (|r| < 3.4e38)")
    return (
        f"{n} steps in a row (up to step {step}) had a non-finite loss, gradient or update "
        f"(last: loss={row['loss']}, grad_norm={row['grad_norm']}, pg_loss={row['pg_loss']}, "
        f"kl_loss={row['kl_loss']}); those updates were skipped, so parameters and optimizer state are "
        f"those of the last good step. {kept}. "
        "Lower optim.learning_rate or check the rewards; raise max_nonfinite_steps to tolerate more."
    )


def _checkpoint_tree(state: st.TrainState, snapshots: collections.deque) -> dict[str, Any]:
    return {"train": state, "snapshots": list(snapshots)}


@dataclasses.dataclass
class Iteration:
    """What one RL iteration produced.

    state: the train state after the update(s); snapshots: the sampler's parameter queue after it
    (unchanged when rl.async_level is 0); beta: the KL coefficient for the next iteration; row: the
    metrics row `train` writes for this step; batch, info: what was trained on (token counts, texts);
    tokens: the step's prompt + completion tokens (what TRL's num_tokens adds up).
    """

    state: st.TrainState
    snapshots: collections.deque
    beta: float
    row: dict[str, float]
    batch: Batch
    info: RolloutInfo
    tokens: int = 0


def step_examples(run: Run, step: int) -> list[Example]:
    """The prompts of 0-based `step`: the data position is the step itself, so a resumed run sees the same."""
    c = run.config
    if hasattr(run.task, "epoch_examples"):  # file tasks: every row once per epoch, in a seeded order
        position = step * c.rl.prompts_per_step + run.data_offset
        return run.task.epoch_examples(c.task.split, position, c.rl.prompts_per_step, c.seed)
    return run.task.examples(c.task.split, n=c.rl.prompts_per_step, seed=_step_seed(c.seed, step))


def _trainer_state(run: Run, step: int) -> Any:
    """TRL's `trainer_state` before 0-based `step` (global_step = step, epoch, max_steps)."""
    c = run.config
    return trainer_state(run.task, c.task.split, step, step * c.rl.prompts_per_step + run.data_offset, c.steps)


def iteration(run: Run, state: st.TrainState, ref_params: Any, step: int, *, beta: float,
              snapshots: Sequence[Any] = (), examples: Sequence[Example] | None = None,
              reward_state: Callable[[Any], Any] | None = None) -> Iteration:
    """One RL iteration at 0-based `step`: rollout (sample, reward, score) -> rl.updates_per_batch
    train steps -> the metrics row; the loop body of `train`, and what `kljax bench rl` times.

    `state` is donated to the train step: use only the returned one. `snapshots` is the queue of
    rl.async_level earlier parameters (the sampler uses the oldest); `examples` overrides the step's
    prompts (`step_examples`), e.g. for a benchmark that must feed another trainer the same ones;
    `reward_state(trainer_state)` picks the reward functions' `trainer_state` (the observers').
    """
    config, rl, kl = run.config, run.config.rl, run.config.kl
    t_step = time.perf_counter()
    examples = step_examples(run, step) if examples is None else examples
    key = jax.random.fold_in(jax.random.PRNGKey(config.seed), step)
    if rl.async_level and not snapshots:
        raise ValueError(f"rl.async_level={rl.async_level} needs the queue of earlier parameters (snapshots)")
    sampler_params = run.policy_params(snapshots[0] if rl.async_level else state.params)
    if run.reward is not None:  # TRL's `trainer_state` argument of the reward functions
        run.reward.state = (reward_state or (lambda s: s))(_trainer_state(run, step))
    batch, info = rollout(run.rollout_setup, examples, sampler_params=sampler_params,
                          params=run.policy_params(state.params), ref_params=ref_params, beta=beta, key=key)
    queue = collections.deque(snapshots, maxlen=max(rl.async_level, 1))  # a new one: the caller's is left as is
    if rl.async_level:
        queue.append(frozen_copy(state.params, run.policy.model))  # before the train step donates them
    t0 = time.perf_counter()
    for _ in range(rl.updates_per_batch):
        state, step_metrics = run.step_fn(state, batch, ref_params)
    jax.block_until_ready(state.params)
    update_time = time.perf_counter() - t0
    row = to_python(step_metrics)
    if not run.kl_in_update:  # else the update's forward reported them (decided once, in `build`)
        row.update(to_python(batch_kl_metrics(info.scored, batch.response_mask_br)))
    n_tokens = float(jnp.sum(batch.response_mask_br))
    elapsed = time.perf_counter() - t_step
    row.update(
        accuracy=info.accuracy_mean,
        kl_penalty=float(beta * row["kl_seq"]) if kl.in_reward else 0.0,
        time_sample=info.times["sample"], time_reward=info.times["reward"], time_score=info.times["score"],
        time_update=update_time, time_step=elapsed, tokens_per_s=n_tokens / max(elapsed, 1e-9),
    )
    row["host_memory_mb"] = host_memory_mb()
    if run.exact is not None:  # exact/gap, exact/J, ... at the updated params, this step's beta
        row.update(run.exact(run.policy_params(state.params), beta))
    # TRL's names (`kljax.train.trl_metrics`): reward, reward_std, rewards/NAME/mean, completions/*, ...
    trl, tokens = rollout_metrics(info, batch, rl.group_size, run.mesh)
    row.update(trl, learning_rate=st.last_learning_rate(config.run_optim, state.opt_state, row["nonfinite"] > 0),
               epoch=trainer_state(run.task, config.task.split, step + 1,
                                   (step + 1) * rl.prompts_per_step + run.data_offset, config.steps).epoch)
    if not trl_kl_logged(kl.beta, kl.placement):
        row.pop("kl")
    # error counts and log_metric names (config.reward); a log_metric name never replaces a metric of the run
    row.update({k: v for k, v in info.reward_metrics.items() if k not in row})
    next_beta = float(adapt_beta(beta, row["kl_seq"], kl)) if math.isfinite(row["kl_seq"]) else beta
    return Iteration(state, queue, next_beta, row, batch, info, tokens)


def check_workdir_for_run(workdir: str | Path, resume: bool | str) -> None:
    """The checks of WORKDIR before a run writes anything there (UserErrors): a new run needs a directory
    without another run's checkpoints and without run files kljax did not write; --resume needs a
    checkpoint (but --resume=auto)."""
    workdir, mode = Path(workdir), _resume_mode(resume)
    ckpt = workdir / "checkpoints"
    steps = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else []
    if not ckpt.is_dir():
        check_claimable(workdir)
    if steps and not mode:
        raise UserError(f"{workdir} already holds a run (checkpoint at step {steps[-1]}); pass --resume or a new "
                        "--workdir")
    if mode and not steps and mode != "auto":
        raise UserError(f"--resume: {workdir} holds no checkpoint to resume from; pass --resume=auto to start a "
                        "new run when there is none")


def _closed_at_exit(open_files: contextlib.ExitStack, thing: T) -> T:
    """`thing`, closed when `open_files` ends; when it ends by an error, a failing close (a logger whose
    file the error took) is dropped so that the user reads that error."""

    def close(error_type: Any, error: Any, traceback: Any) -> bool:
        try:
            thing.close()
        except Exception:
            if error_type is None:
                raise
        return False

    open_files.push(close)
    return thing


def _train(config: RunConfig, workdir: Path, resume: str | None, progress: bool, stop_after: int | None,
           functions: Sequence[Any] | None, events: Observers, reward_guard: Any,
           open_files: contextlib.ExitStack) -> dict[str, Any]:
    objective = warn_if_biased(RunObjective.from_rl(config.rl, config.kl))
    main = distributed.is_main_process()
    if main:
        print(f"kljax train: objective {objective.name}: {objective.verdict}, E[gradient] = {objective.gradient}",
              flush=True)
    check_workdir_for_run(workdir, resume or False)
    workdir.mkdir(parents=True, exist_ok=True)
    if main and not (workdir / "checkpoints").is_dir():  # a new run: never over files kljax did not write
        claim_run_dir(workdir)
    ckpt = _closed_at_exit(open_files, RunCheckpointer(workdir / "checkpoints", config.keep_checkpoints))
    latest = ckpt.latest_step()
    resuming = bool(resume and latest is not None)
    if resuming:  # every process checks (all must refuse), process 0 records; before anything compiles
        check_resume_workdir(workdir, config.to_dict(), record=main)
    run, state, ref_params = build(config, functions, reward_guard)
    if run.reward is not None:
        _closed_at_exit(open_files, run.reward)
    config, rl, kl = run.config, run.config.rl, run.config.kl
    snapshots: collections.deque = collections.deque(
        [ref_params if run.base is None else frozen_copy(state.params, run.policy.model)] * rl.async_level,
        maxlen=max(rl.async_level, 1)
    )
    beta = float(kl.beta)
    start, num_tokens = 0, 0.0  # TRL's num_tokens: prompt + completion tokens of every step so far
    writer = _closed_at_exit(open_files, MetricsWriter(workdir, config=config, resume=resuming))
    if resuming:
        like = _checkpoint_tree(state, snapshots)
        snapshot_shardings = collections.deque([run.state_shardings.params] * len(snapshots))
        shardings = _checkpoint_tree(run.state_shardings, snapshot_shardings)
        latest, restored, meta, damaged = ckpt.restore_intact(like, shardings, strict=resume == "strict")
        for bad, why in damaged if main else ():
            print(f"kljax train: checkpoint at step {bad} is damaged ({why}); set aside in "
                  f"{ckpt.directory}.damaged, resuming from step {latest}", file=sys.stderr, flush=True)
        state = restored["train"]
        if run.base_identity is not None:  # adapters apply only to the base they were trained on
            where = f"checkpoint at step {latest} in {ckpt.directory}"
            check_same_base(meta.get("lora_base"), run.base_identity, where)
        snapshots = collections.deque(restored["snapshots"], maxlen=max(rl.async_level, 1))
        beta, start = float(meta["beta"]), int(meta["step"])
        num_tokens = resumed_num_tokens(meta, read_jsonl(workdir / "metrics.jsonl") if main else [], start)
        run.data_offset = int(meta.get("data_position", start * rl.prompts_per_step)) - start * rl.prompts_per_step
        for name in ("metrics.jsonl", "samples.jsonl") if main else ():  # atomically; a cut last line is said
            note = run_logs.truncate_jsonl(workdir / name, start)
            if note:
                print(f"kljax train: {note}", file=sys.stderr, flush=True)
        writer.truncate_after(start)
    else:
        writer.truncate_after(0)  # rows of an earlier attempt that died before its first checkpoint
        if main:
            (workdir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
            (workdir / "samples.jsonl").unlink(missing_ok=True)
        if main:
            print(f"kljax train: {eval_note(plan_for_run(run), 'before training')}", flush=True)
        if run.reward is not None:  # the evaluation's rewards see step 0 of a run of config.steps
            run.reward.state = events.reward_state(_trainer_state(run, start))
        before = evaluate_splits(run, run.policy_params(state.params))
        if main:
            run_logs.write_json(workdir / "eval_before.json", before)
            if run.exact is not None:
                run_logs.write_json(workdir / "exact_before.json", run.exact(ref_params, beta))

    def save(done: int) -> None:
        meta = {"step": done, "beta": beta, "data_position": done * rl.prompts_per_step + run.data_offset,
                "num_tokens": num_tokens if math.isfinite(num_tokens) else None}
        if run.base_identity is not None:
            meta["lora_base"] = run.base_identity
        ckpt.save(done, _checkpoint_tree(state, snapshots), meta)
        events.on_save()

    events.state.max_steps, events.state.global_step = config.steps, start
    events.on_train_begin()
    done, row = start, {}
    nonfinite_run = 0
    if main and start < config.steps:  # the first step's wait, said (kljax.train.evaluate_loop.eval_note)
        print(f"kljax train: training {config.steps - start} steps; the first also compiles the train step "
              "(on CPU a minute or more; a rerun reuses the compilation cache)", flush=True)
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, disable=not (progress and main),
               desc="kljax train", dynamic_ncols=True)
    for step in bar:
        events.on_step_begin()
        it = iteration(run, state, ref_params, step, beta=beta, snapshots=snapshots, reward_state=events.reward_state)
        state, snapshots, beta, row = it.state, it.snapshots, it.beta, it.row
        num_tokens += it.tokens
        row["num_tokens"] = num_tokens
        every = config.log_samples_every
        if every and (step + 1) % every == 0 and main and jax.process_count() == 1:
            records = run_logs.sample_records(step + 1, step_examples(run, step), it.info, it.batch, rl.group_size,
                                              config.log_samples_n)
            run_logs.append_jsonl(workdir / "samples.jsonl", records)
        del it  # the batch and rollout info are not needed past the iteration
        done = step + 1
        events.state.global_step, events.state.epoch = done, _trainer_state(run, done).epoch
        events.on_step_end()
        control = events.control
        every = config.eval_every
        if ((every and done % every == 0) or control.should_evaluate) and done < config.steps:
            results = with_deltas(before_results(workdir), evaluate_splits(run, run.policy_params(state.params)),
                                  plan_for_run(run).seed)
            row.update(run_logs.eval_metrics(results))
            if main:
                run_logs.write_json(workdir / f"eval_step_{done}.json", results)
            events.on_evaluate(results)
        writer.write(done, row)
        events.state.log_history.append({"step": done, **row})
        events.on_log(row)
        if not progress and main:
            print(run_logs.step_line(done, config.steps, row), flush=True)
        nonfinite_run = nonfinite_run + 1 if row["nonfinite"] > 0 else 0
        if nonfinite_run >= config.max_nonfinite_steps:  # open_files closes the writer and checkpointer
            raise NonFiniteError(_nonfinite_message(nonfinite_run, done, row, ckpt.latest_step(), workdir))
        bar.set_postfix({k: f"{row[k]:.3g}" for k in (*PROGRESS_KEYS, "exact/gap") if k in row})
        stopping = (stop_after is not None and done - start >= stop_after) or control.should_training_stop
        if done % config.checkpoint_every == 0 or done == config.steps or stopping or control.should_save:
            save(done)
        control.reset_step()
        if stopping:
            break
    bar.close()
    writer.close()
    ckpt.close()
    if run.reward is not None:
        run.reward.close()
    if nonfinite_run and nonfinite_run == done - start:  # not one good step: the run learned nothing
        raise NonFiniteError(_nonfinite_message(nonfinite_run, done, row, ckpt.latest_step(), workdir))
    if done < config.steps:
        events.on_train_end()
        return {"before": {}, "after": {}, "params": run.policy_params(state.params), "stopped_at": done,
                "policy": run.policy}
    before_path = workdir / "eval_before.json"
    before = json.loads(before_path.read_text()) if before_path.exists() else {}
    if main:
        print(f"kljax train: {eval_note(plan_for_run(run), 'after training')}", flush=True)
    if run.reward is not None:
        run.reward.state = events.reward_state(_trainer_state(run, done))
    after = with_deltas(before, evaluate_splits(run, run.policy_params(state.params)), plan_for_run(run).seed)
    if main:
        run_logs.write_json(workdir / "eval_after.json", after)
    events.on_evaluate(after)
    events.on_train_end()
    summary = {"before": before, "after": after, "params": run.policy_params(state.params), "policy": run.policy}
    exact_path = workdir / "exact_before.json"
    if run.exact is not None and exact_path.exists():
        after_gap = run.exact(run.policy_params(state.params), beta)["exact/gap"]
        summary["exact"] = {"before": json.loads(exact_path.read_text())["exact/gap"], "after": after_gap}
    return summary


RESUME_MODES = ("latest", "auto", "strict")


def _resume_mode(resume: bool | str) -> str | None:
    mode = "latest" if resume is True else (resume or None)
    if mode not in (None, *RESUME_MODES):
        raise UserError(f"--resume={resume!r} is not valid; choose one of {list(RESUME_MODES)} (or plain --resume)")
    return mode


def train(config: RunConfig, workdir: str | Path, resume: bool | str = False, progress: bool = True,
          stop_after: int | None = None, functions: Sequence[Any] | None = None,
          observers: Sequence[LoopObserver] = (), reward_guard: Any = None) -> dict[str, Any]:
    """Run (or resume) the configured RL run; returns a summary with before/after evaluations.

    resume: False starts a new run (a workdir holding a checkpoint is an error); True or "latest"
    continues from the newest intact checkpoint (none is an error; damaged newer ones are reported
    and set aside), "auto" also starts a new run when there is none, "strict" refuses a damaged
    latest checkpoint. A resumed config may change only `resume_check.SAFE_FIELDS`.
    `stop_after` ends this invocation after that many steps (checkpointing first); `functions`: the
    reward functions (None: config.reward's); `observers` see every step (`kljax.train.events`);
    `reward_guard(who, active)`: the context each in-process reward call runs in (`RewardSet`).
    """
    mode = _resume_mode(resume)
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 1):
        raise UserError(f"--stop-after={stop_after!r} must be an integer >= 1 (steps to run in this invocation)")
    with contextlib.ExitStack() as open_files:  # closed however the run ends: a Ctrl-C loses no row or save
        return _train(config, Path(workdir), mode, progress, stop_after, functions, Observers(observers),
                      reward_guard, open_files)
