"""`toy_optimum`: the exact-optimum toy tasks (`kljax.tasks.exact_optimum`) as a task `kljax train` runs.

Token ids are the responses themselves: a response is up to R tokens over ids 0..V-1 that ends at its first
stop token V-1 or fills the buffer (`tabular.all_responses`); prompt p, one per reward shape
(config.task.toy.shapes), is the one token p. The tokenizer shows the ids as symbols: letters in order, "."
for the stop token (V = 3: responses "a.", "ab.", "bba", ...). The n prompts of a step are prompt i % P for
i < n, so rl.prompts_per_step = k * P sees every prompt k times.

The rewards are defined relative to pi_ref (the "sparse" one sits on the full-length sequence pi_ref finds
least likely), so the run binds the task to its policy and reference parameters (`bind`) before the first
rollout; `exact_metrics` then gives the exact gap to the optimum pi*. pi and pi_ref are the run's policy and
reference at rl.temperature T: the policy trained is the tempered one, softmax(logits / T)
(`RLConfig.policy_temperature`), so the reward tables, pi* and every metric are the tempered ones.
Model sources: "tabular" (`TabularPolicy(V, R, P)`) or "tiny" (the tiny transformer over max(V, P) ids).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kljax.config.rl import policy_temperature
from kljax.models.tokenizers import SymbolTokenizer
from kljax.policies.protocol import as_policy
from kljax.policies.tabular import TabularPolicy, all_responses
from kljax.tasks.base import Example, Score, Task
from kljax.tasks.exact_optimum import SHAPES, ToyTask, exact_metrics, make_task, task_logps

STOP_SYMBOL = "."
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MAX_RESPONSES = 4096  # every step sums over all P * N (prompt, response) pairs
EXACT_KEYS = ("gap", "J", "reward", "kl_seq", "kl_opt", "J_opt")
MODEL_SOURCES = ("tabular", "tiny")


def symbols(vocab: int, size: int) -> str:
    """The symbol of each of `size` ids: letters, with "." for the stop id vocab - 1."""
    letters = iter(LETTERS)
    return "".join(STOP_SYMBOL if i == vocab - 1 else next(letters) for i in range(size))


class _Tempered:
    """`policy` whose teacher-forced log-probs are those of softmax(logits / temperature): the
    policy a run at rl.temperature trains (what `make_task` and `task_logps` read)."""

    def __init__(self, policy: Any, temperature: float) -> None:
        self.policy, self.temperature = policy, float(temperature)

    def teacher_forced(self, params: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.policy.teacher_forced(params, *args, temperature=self.temperature, **kwargs)


class ToyOptimumTask(Task):
    name = "toy_optimum"
    splits = ("train",)

    def __init__(self, shapes: str | Sequence[str] = SHAPES, vocab: int = 3, response_len: int = 3,
                 temperature: float = 1.0) -> None:
        """shapes: reward shapes, one prompt each, as a sequence or comma-separated (config.task.toy);
        temperature: the run's rl.temperature (0, greedy, trains T = 1: `sampling.logits.policy_temperature`)."""
        temperature = float(temperature)
        if not temperature >= 0:
            raise ValueError(f"rl.temperature={temperature} must be >= 0")
        self.temperature = policy_temperature(temperature)
        shapes = tuple(s.strip() for s in shapes.split(",") if s.strip()) if isinstance(shapes, str) else tuple(shapes)
        bad = [s for s in shapes if s not in SHAPES]
        if bad or not shapes:
            raise ValueError(f"config.task.toy.shapes={','.join(shapes)!r}: {bad or 'none given'} not valid; "
                             f"give a comma-separated list of {list(SHAPES)}")
        size = max(vocab, len(shapes))
        if not 2 <= vocab or size > len(LETTERS) + 1:
            raise ValueError(f"config.task.toy.vocab={vocab} must be >= 2, and vocab and the number of shapes "
                             f"at most {len(LETTERS) + 1}")
        if response_len < 1:
            raise ValueError(f"config.task.toy.response_len={response_len} must be >= 1")
        self.shapes, self.vocab, self.response_len = shapes, int(vocab), int(response_len)
        self.responses_nr, self.mask_nr = all_responses(self.vocab, self.response_len, self.stop_token)
        if len(self.responses_nr) > MAX_RESPONSES:
            raise ValueError(f"config.task.toy: vocab={vocab}, response_len={response_len} give "
                             f"{len(self.responses_nr)} responses per prompt, more than the {MAX_RESPONSES} "
                             "every step can enumerate; lower one of them")
        self.tokenizer = SymbolTokenizer(symbols(self.vocab, size), eos_token_id=self.stop_token)
        self.response_texts = [self.tokenizer.decode(t[m]) for t, m in zip(self.responses_nr, self.mask_nr,
                                                                            strict=True)]
        self._index = {text: i for i, text in enumerate(self.response_texts)}
        self.table: ToyTask | None = None
        self._exact: Any = None

    @property
    def stop_token(self) -> int:
        return self.vocab - 1

    @property
    def num_prompts(self) -> int:
        return len(self.shapes)

    def tabular_policy(self) -> TabularPolicy:
        return TabularPolicy(self.vocab, self.response_len, self.num_prompts)

    def check_run_settings(self, max_prompt_len: int, max_new_tokens: int, prompt_format: str) -> None:
        """The run settings this task needs: raw one-token prompts and a buffer of R new tokens."""
        if max_new_tokens != self.response_len:
            raise ValueError(f"rl.max_new_tokens={max_new_tokens} must equal config.task.toy.response_len="
                             f"{self.response_len} (the enumerated responses fill that buffer)")
        if prompt_format != "raw":
            raise ValueError(f"config.task.prompt_format={prompt_format!r}: task {self.name} needs 'raw' (its "
                             "prompt is one token; its tokenizer has no chat template)")
        if max_prompt_len < 1:
            raise ValueError(f"rl.max_prompt_len={max_prompt_len} must be >= 1")

    def bind(self, policy: Any, ref_params: Any) -> None:
        """Build the reward tables against pi_ref (`exact_optimum.make_task`) and the exact metrics, both
        for the tempered policy softmax(logits / self.temperature) that the run trains."""
        tempered = _Tempered(as_policy(policy), self.temperature)
        table = make_task(self.shapes, self.vocab, self.response_len, policy=tempered, ref_params=ref_params)
        ref_logp_pn = task_logps(table, ref_params)
        rewards_pn = jnp.asarray(table.rewards_pn, jnp.float32)
        self.table = table
        self._exact = jax.jit(lambda params, beta: exact_metrics(task_logps(table, params), ref_logp_pn,
                                                                 rewards_pn, beta))

    def exact_optimum(self, model: Any, ref_params: Any) -> Callable[[Any, float], dict[str, float]]:
        """`bind` to the run's model and pi_ref; then `exact_metrics` is the run's exact ruler."""
        self.bind(model, ref_params)
        return self.exact_metrics

    def _bound(self) -> ToyTask:
        if self.table is None:
            raise RuntimeError(f"task {self.name}: call bind(policy, ref_params) first (its rewards depend on pi_ref)")
        return self.table

    def best_response(self, prompt: int) -> str:
        return self.response_texts[int(np.argmax(self._bound().rewards_pn[prompt]))]

    def examples(self, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
        self.validate_split(split)
        n = self.num_prompts if n is None else n
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        out = []
        for i in range(n):
            p = i % self.num_prompts
            answer = self.best_response(p) if self.table is not None else ""
            out.append(Example(prompt=self.tokenizer.symbols[p], answer=answer, task=self.name, split=split,
                               id=f"{split}-{i}", metadata={"prompt": p, "shape": self.shapes[p]}))
        return out

    def check(self, example: Example, completion: str) -> Score:
        """R_p(y) from the table; correct when it is the prompt's highest reward."""
        index = self._index.get(completion)
        if index is None:
            raise ValueError(f"{completion!r} is not a response of task {self.name} (those are "
                             f"{self.response_texts[:8]}{' ...' if len(self.response_texts) > 8 else ''})")
        rewards_n = self._bound().rewards_pn[int(example.metadata["prompt"])]
        return Score(float(rewards_n[index]), bool(rewards_n[index] >= rewards_n.max() - 1e-12))

    def exact_metrics(self, params: Any, beta: float) -> dict[str, float]:
        """{"exact/KEY": value} for EXACT_KEYS at `params`, with the step's beta, as sums over all N responses
        of every prompt (means over prompts):
            exact/gap = beta KL(pi || pi*) = J(pi*) - J(pi),  exact/J,  exact/reward = E_pi[R],
            exact/kl_seq = KL(pi || pi_ref),  exact/kl_opt = KL(pi* || pi),  exact/J_opt = J(pi*)."""
        self._bound()
        values = self._exact(params, jnp.float32(beta))
        return {f"exact/{k}": float(values[k]) for k in EXACT_KEYS}
