"""Evaluation: greedy accuracy, mean@k and unbiased pass@k on in-domain and out-of-domain task splits.

For each task split, `n_examples` prompts are drawn with `task.examples(split, n, seed)` and sent through the
jitted sampler twice, batched:
  * greedy (one completion per prompt)              -> greedy accuracy (and mean reward);
  * `n` samples per prompt (`SamplingParams.n`) at temperature T (top-p / top-k as configured): for prompt i,
    c_i of the n samples are correct, and with k <= n
        mean@k  = mean_i (1/n) sum_j correct_ij             (expected accuracy of one sample; n = k by default)
        pass@k  = mean_i [ 1 - C(n - c_i, k) / C(n, k) ]     (unbiased, `pass_at_k`)
A split is out-of-domain when its name starts with "ood", or when it belongs to another task than the one
the model was trained on (known for a `kljax train` workdir); otherwise in-domain.
Models: "tiny" (random init, `config.model.tiny`), "default" (SmolLM2-135M-Instruct), a Hugging Face
checkpoint directory (e.g. one written by `kljax.models.convert.export_hf` or `kljax.train.sft`), or a
`kljax train` workdir's latest (or chosen) checkpoint, restored with `RunCheckpointer` (`restore_params`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from kljax.config.run import RunConfig
from kljax.tasks.registry import parse_task_spec
from kljax.train import evaluate_loop
from kljax.train.memory_check import check_eval_fits
from kljax.train.rollout import prompt_texts

# ------------------------------------------------------------------------------------------ estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1: unbiased for P(at least one of k is correct)).

    Product form, which never forms a large binomial coefficient: C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n}
    (1 - k/i), and pass@k = 1 when n - c < k. Needs 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(correct_pn: np.ndarray, k: int) -> float:
    """pass@k averaged over prompts; correct_pn [P, n] bool (n samples of each of P prompts)."""
    correct_pn = np.asarray(correct_pn, bool)
    n = correct_pn.shape[1]
    return float(np.mean([pass_at_k(n, int(c), k) for c in correct_pn.sum(axis=1)]))


def mean_at_k(correct_pn: np.ndarray) -> float:
    """mean@k: the mean accuracy over all samples of all prompts, (1/(P n)) sum_ij correct_ij [P, n]."""
    return float(np.mean(np.asarray(correct_pn, np.float64)))


# ------------------------------------------------------------------------------------------ settings


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """k: the k of pass@k and mean@k; n_samples: samples per prompt (>= k; default k); n_examples per
    split (n_examples_ood per ood* split when > 0); sampling temperature/top_p/top_k; prompt and
    response buffer sizes; batch_size: sequences per sampler call (None: as a run's evaluation,
    `evaluate_loop.rows_per_call`); prompt_format: chat, plain or raw; seed: examples and keys;
    stop: rl.stop (strings or ids that end a response, as in training)."""

    k: int = 4
    n_samples: int | None = None
    n_examples: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_len: int = 64
    max_new_tokens: int = 32
    batch_size: int | None = None
    prompt_format: str = "chat"
    seed: int = 0
    stop: tuple[str | int, ...] = ()
    n_examples_ood: int = 0

    def size(self, split: str) -> int:
        """Problems evaluated of a split named `split`."""
        return self.n_examples_ood if split.startswith("ood") and self.n_examples_ood > 0 else self.n_examples

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k={self.k} must be >= 1")
        if self.n_samples is not None and self.n_samples < self.k:
            raise ValueError(f"n_samples={self.n_samples} must be >= k={self.k} (pass@k needs n >= k)")
        if self.n_examples < 1 or (self.batch_size is not None and self.batch_size < 1) or self.n_examples_ood < 0:
            raise ValueError("n_examples and batch_size must be >= 1")

    @property
    def samples(self) -> int:
        return self.n_samples or self.k

    @classmethod
    def from_run_config(cls, config: RunConfig, **changes: Any) -> EvalSettings:
        """Defaults from a run config (its prompt format, buffers, temperature, eval_examples, seed, and
        k = its eval_samples, so that a run's checkpoint is evaluated as the run evaluated it)."""
        rl = config.rl
        values = dict(
            k=config.eval_samples or 4, n_examples=config.eval_examples, n_examples_ood=config.eval_examples_ood,
            temperature=rl.temperature,
            top_p=rl.top_p, top_k=rl.top_k, max_prompt_len=rl.max_prompt_len, max_new_tokens=rl.max_new_tokens,
            prompt_format=config.task.prompt_format, seed=config.seed, stop=tuple(rl.stop),
        )
        values.update({k: v for k, v in changes.items() if v is not None})
        if changes.get("n_examples") is not None:  # --n-examples: every split
            values["n_examples_ood"] = 0
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Split:
    """One task split to evaluate: its spec ("arithmetic:ood_digits"), the task object, the split."""

    spec: str
    task: Any
    split: str


def parse_tasks(specs: str | Sequence[str], data_dir: str = "") -> list[Split]:
    """"name:split,name:split" -> Splits; a bare "name" means every split of the task except train."""
    items = [s.strip() for s in specs.split(",")] if isinstance(specs, str) else [s.strip() for s in specs]
    out = []
    for item in filter(None, items):
        kwargs = {"data_dir": data_dir} if data_dir else {}
        try:
            task, split = parse_task_spec(item, **kwargs)
        except TypeError:  # generated tasks take no data_dir
            task, split = parse_task_spec(item)
        if task.tokenizer is not None:
            raise ValueError(f"--tasks {item!r}: task {task.name!r} has token ids of its own and rewards relative "
                             "to a run's pi_ref; `kljax train` measures it exactly (exact/gap in metrics.jsonl)")
        splits = [split] if split else [s for s in task.splits if s != "train"] or list(task.splits)
        out.extend(Split(f"{task.name}:{s}", task, s) for s in splits)
    if not out:
        raise ValueError(f"no task splits in {specs!r}; give e.g. arithmetic:test,arithmetic:ood_digits")
    return out


def domain(split: Split, train_task: str | None = None) -> str:
    """"ood" for splits named ood* or of another task than the training task, else "in"."""
    if split.split.startswith("ood") or (train_task is not None and split.task.name != train_task):
        return "ood"
    return "in"


# ------------------------------------------------------------------------------------------ models


# ------------------------------------------------------------------------------------------ evaluation


def plan_of(s: EvalSettings, model: Any, splits: Sequence[str] = ()) -> evaluate_loop.EvalPlan:
    """The evaluation core's plan (`kljax.train.evaluate_loop.EvalPlan`) for these settings and model."""
    rows = s.batch_size or evaluate_loop.rows_per_call(model, 0, s.max_prompt_len + s.max_new_tokens, s.samples)
    return evaluate_loop.EvalPlan(
        splits=tuple(splits), n_examples=s.n_examples, n_examples_ood=s.n_examples_ood, seed=s.seed,
        samples=s.samples, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_prompt_len=s.max_prompt_len,
        max_new_tokens=s.max_new_tokens, rows_per_call=max(rows, 1 + s.samples), prompt_format=s.prompt_format,
        stop=s.stop,
    )


def evaluate_split(policy: Any, params: Any, split: Split, s: EvalSettings, mesh: Any = None,
                   key: jax.Array | None = None, bar: Any = None) -> dict[str, Any]:
    """Greedy accuracy/reward, mean@k, pass@k (and pass@1) of one split, `greedy` and `sampled` with
    their 95% intervals (`kljax.train.evaluate_loop`); also the greedy completions."""
    key = jax.random.PRNGKey(s.seed) if key is None else key
    examples = split.task.examples(split.split, n=s.size(split.split), seed=s.seed)
    texts = prompt_texts(examples, split.task, policy.tokenizer, s.prompt_format)
    plan = plan_of(s, policy.model, (split.split,))
    o = evaluate_loop.evaluate_split(policy, params, examples, texts, evaluate_loop.scorer(split.task), plan, key,
                                     mesh, None if bar is None else bar.update)
    entry = evaluate_loop.summarize_split(o, plan)
    return {
        "task": split.task.name, "split": split.split, "n": len(examples),
        "greedy_accuracy": entry["accuracy"], "greedy_reward": entry["reward"],
        "k": s.k, "n_samples": s.samples, "temperature": s.temperature,
        "mean_at_k": mean_at_k(o.sampled_correct), "pass_at_k": mean_pass_at_k(o.sampled_correct, s.k),
        "pass_at_1": mean_pass_at_k(o.sampled_correct, 1), "sample_reward": entry["sampled_reward"],
        "greedy": entry["greedy"], "sampled": entry["sampled"], "problems": entry["problems"],
        "greedy_completions": o.completions,
    }


def evaluate(policy: Any, params: Any, splits: Sequence[Split], s: EvalSettings, mesh: Any = None,
             train_task: str | None = None, progress: bool = True) -> dict[str, dict[str, Any]]:
    """{spec: metrics} for every split (see `evaluate_split`), each tagged with its domain ("in"/"ood")."""
    total = sum(_split_size(sp, s) for sp in splits) * (1 + s.samples)
    results = {}
    with tqdm(total=total, disable=not progress, desc="kljax eval", unit="seq", dynamic_ncols=True) as bar:
        for i, sp in enumerate(splits):
            bar.set_postfix_str(sp.spec)
            key = jax.random.fold_in(jax.random.PRNGKey(s.seed), i)
            results[sp.spec] = {**evaluate_split(policy, params, sp, s, mesh, key, bar),
                                "domain": domain(sp, train_task)}
    return results


def check_memory(splits: Sequence[Split], s: EvalSettings) -> None:
    """UserError when the examples and completions of `splits` cannot fit in host memory
    (`kljax.train.memory_check`), before any example is made."""
    check_eval_fits(sum(_split_size(sp, s) for sp in splits), s.samples)


def _split_size(split: Split, s: EvalSettings) -> int:
    """How many examples a split yields for n_examples (loaded sets may have fewer); for the bar only."""
    size = getattr(split.task, "default_size", {}).get(split.split)
    return s.size(split.split) if size is None else min(size, s.size(split.split))


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """A fixed-width table: split, domain, n, greedy accuracy and sampled accuracy (mean@k at the
    temperature) with their 95% intervals, pass@k."""
    if not results:
        return "(no results)"
    first = next(iter(results.values()))
    k, t = first["k"], first["temperature"]
    width = max(12, *(len(spec) for spec in results))
    sampled = f"sampled T={t:g}, {first['n_samples']} per problem"
    lines = [f"{'task:split':<{width}}  domain  {'n':>5}  {'greedy [95% interval]':<22}  {sampled:<30}  pass@{k}"]
    for spec, r in results.items():
        g, smp = r["greedy"], r["sampled"]
        lines.append(f"{spec:<{width}}  {r['domain']:<6}  {r['n']:>5}  "
                     f"{g['accuracy']:.3f} [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]  "
                     f"{smp['accuracy']:.3f} [{smp['ci95'][0]:.3f}, {smp['ci95'][1]:.3f}]{'':<8}  {r['pass_at_k']:.3f}")
    return "\n".join(lines)


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Mean greedy accuracy, mean@k and pass@k over the in-domain and over the out-of-domain splits."""
    out = {}
    for dom in ("in", "ood"):
        rows = [r for r in results.values() if r["domain"] == dom]
        for metric in ("greedy_accuracy", "mean_at_k", "pass_at_k"):
            out[f"{dom}_{metric}"] = float(np.mean([r[metric] for r in rows])) if rows else math.nan
    return out
