"""What a run writes besides checkpoints and metrics: samples.jsonl, eval_step_N.json, one line per step.

    write_json(path, obj)                  JSON with null for NaN/inf (never bare NaN)
    sample_records(step, examples, info, batch, group_size, n)  -> the samples.jsonl rows of a step
    eval_metrics(results)                  {"eval/SPLIT/accuracy": ..., "eval/SPLIT/reward": ...,
                                           "eval/SPLIT/sampled_accuracy": ...,
                                           "eval/SPLIT/rewards/NAME/mean": ... (each reward function)}
    step_line(step, steps, row)            "step 3/10 reward=0.250 accuracy=0.125 kl_seq=0.012 ..."
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kljax.errors import UserError

LINE_KEYS = ("reward", "accuracy", "kl_seq", "beta", "entropy", "exact/gap", "time_step")


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None (numpy scalars and arrays made plain)."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of `json_safe(obj)` that refuses NaN (allow_nan=False), so the output is strict JSON."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented strict JSON (non-finite numbers as null)."""
    Path(path).write_text(dumps(obj, indent=2) + "\n")


def sample_records(step: int, examples: Sequence[Any], info: Any, batch: Any, group_size: int,
                   n: int) -> list[dict[str, Any]]:
    """Up to `n` sequences of a step (this process's rows): prompt, completion, total and per-function
    rewards, the sequence's advantage (mean over its tokens) and its KL estimate sum_t (log pi - log pi_ref)
    (null when the rollout did not compute log pi)."""
    rows = np.arange(len(info.completions)) if info.rows is None else np.asarray(info.rows)
    mask = np.asarray(batch.response_mask_br, np.float32)
    adv = np.asarray(batch.advantages_br, np.float32)
    logp = info.scored.get("logp")
    kl = None
    if logp is not None:
        kl = (np.asarray(logp, np.float32) - np.asarray(batch.ref_logp_br, np.float32)) * mask
    out = []
    for j, r in enumerate(rows[:n]):
        r = int(r)
        tokens = float(mask[r].sum())
        ex = examples[r // group_size]
        out.append({
            "step": int(step), "example": ex.id, "prompt": ex.prompt, "answer": ex.answer,
            "completion": info.completions[j], "reward": float(info.rewards[j]),
            "rewards": {k: float(v[j]) for k, v in info.reward_parts.items()},
            "advantage": float((adv[r] * mask[r]).sum() / max(tokens, 1.0)),
            "kl": None if kl is None else float(kl[r].sum()), "response_tokens": int(tokens),
        })
    return out


def append_jsonl(path: str | os.PathLike, records: Sequence[Mapping[str, Any]]) -> None:
    """Append one strict-JSON line per record."""
    with open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(dumps(rec) + "\n")


def truncate_jsonl(path: str | os.PathLike, step: int) -> str | None:
    """Keep the lines of `path` with "step" <= `step` (a resumed run rewrites the others), written to a
    temp file and renamed over `path`, so a kill leaves the old file or the new one.

    A last line that is not JSON (cut short: the run was killed while appending it) is dropped and
    the returned note says so (None when there was nothing to say); a malformed line elsewhere is a
    UserError naming the file and line."""

    path = Path(path)
    if not path.exists():
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start}); a run's JSONL log is, fix or move it") from e
    while lines and not lines[-1].strip():
        lines.pop()
    keep, note = [], None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a JSON {type(row).__name__}, not an object")
        except ValueError as e:
            if i == len(lines) - 1:
                note = (f"{path}: dropped its last line, cut short ({len(line)} characters: the run was killed "
                        "while writing it)")
                break
            raise UserError(f"{path}: line {i + 1} is not a JSON object ({e}); fix or delete that line") from None
        if not isinstance(row.get("step", 0), (int, float)) or row.get("step", 0) <= step:
            keep.append(line)
    if path.name == "metrics.jsonl":  # one row per step: say which rows of the kept steps are gone
        have = {json.loads(line).get("step") for line in keep}
        lost = [s for s in range(1, step + 1) if s not in have]
        if lost:
            shown = f"{lost[0]}-{lost[-1]}" if lost == list(range(lost[0], lost[-1] + 1)) and len(lost) > 2 else \
                ", ".join(map(str, lost))
            note = (f"{path} lacks the rows of step(s) {shown} (emptied or cut after they were checkpointed): "
                    f"they cannot be rebuilt; the run continues from step {step + 1}"
                    + (f" ({note})" if note else ""))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    os.replace(tmp, path)
    return note


def eval_metrics(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The metrics-row entries of an evaluation: eval/SPLIT/accuracy, eval/SPLIT/reward and, with
    reward functions, eval/SPLIT/rewards/NAME/mean (each one's mean, TRL's name)."""
    out = {}
    for split, r in results.items():
        out[f"eval/{split}/accuracy"] = float(r["accuracy"])
        out[f"eval/{split}/reward"] = float(r["reward"])
        if "sampled" in r:  # the accuracy of the policy trained (samples at rl.temperature)
            out[f"eval/{split}/sampled_accuracy"] = float(r["sampled"]["accuracy"])
        for name, mean in r.get("rewards", {}).items():
            out[f"eval/{split}/rewards/{name}/mean"] = float(mean)
    return out


def step_line(step: int, steps: int, row: Mapping[str, float]) -> str:
    """One line for a step (for --no-progress): step, then the main metrics present in `row` (each reward
    function's rewards/NAME/mean and the evaluations' eval/*)."""
    parts = [f"step {step}/{steps}"]
    shown = sorted(k for k in row if k.startswith("eval/") or k.startswith("rewards/") and k.endswith("/mean"))
    for key in (*LINE_KEYS, *shown):
        v = row.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{key}={v:.4g}" if key != "time_step" else f"{key}={v:.2f}s")
    return " ".join(parts)
