"""Countdown: reach a target with + - * / and parentheses over given numbers, each used at most once.

Splits:
  train, test   3 or 4 numbers in [1, 99] and a target in [1, 100] (in-domain; disjoint by key hash)
  ood_numbers   5 or 6 numbers in [1, 99] and a target in [1, 100] (out of domain: more numbers)
A problem is made by combining all of its numbers in a random order with random operations, keeping
every intermediate value a positive integer (divisions exact), so each problem has a solution that
uses every number once; that solution is kept in `metadata["solution"]`. Problems whose target is
one of the numbers are skipped.

Reward: the completion's expression is read from its last `\\boxed{...}`, else its last
`<answer>...</answer>`, else its last "Answer: ..." line; in "expr = 40" the side with an operator is
taken. It is parsed by `kljax.tasks.expression` (never eval'd): 1.0 when it is valid, uses only given
numbers (each at most as often as given) and equals the target exactly; `format_reward` (default 0)
when it is valid but misses the target; 0 otherwise.
"""

from __future__ import annotations

import random
import re
from collections.abc import Hashable
from typing import Any

from kljax.tasks import answers
from kljax.tasks.base import WRONG, Example, GeneratedTask, Score
from kljax.tasks.expression import ExpressionError, check_countdown_expression

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_expression(completion: str) -> str | None:
    """The expression a countdown completion gives as its answer (see the module docstring), or None."""
    if not isinstance(completion, str):
        return None
    found = answers.last_boxed(completion)
    if found is None:
        for match in _ANSWER_TAG.finditer(completion):
            found = match.group(1)
    if found is None:
        found = answers._last_group(answers._ANSWER_LINE, completion)
    if found is None:
        return None
    found = answers.clean_answer(found)
    if "=" in found:
        parts = [p.strip() for p in found.split("=")]
        with_operator = [p for p in parts if any(op in p for op in "+-*/×÷") or "\\times" in p or "\\div" in p]
        found = with_operator[0] if with_operator else parts[0]
    return found or None


class CountdownTask(GeneratedTask):
    """The countdown number game (see the module docstring)."""

    name = "countdown"
    splits = ("train", "test", "ood_numbers")
    default_size = {"train": 10000, "test": 500, "ood_numbers": 500}
    instruction = (
        "Give the expression itself as the final answer, for example \\boxed{(1 + 2) * 3}; "
        "use only the given numbers, each at most once, and only + - * / and parentheses."
    )

    def __init__(
        self,
        count_in_domain: tuple[int, int] = (3, 4),
        count_ood: tuple[int, int] = (5, 6),
        max_number: int = 99,
        target_range: tuple[int, int] = (1, 100),
        format_reward: float = 0.0,
    ):
        if not (2 <= count_in_domain[0] <= count_in_domain[1] < count_ood[0] <= count_ood[1]):
            raise ValueError(
                f"need 2 <= in-domain counts {count_in_domain} < out-of-domain counts {count_ood}, both (lo, hi)"
            )
        if max_number < 2 or target_range[0] > target_range[1]:
            raise ValueError(f"bad max_number {max_number} or target_range {target_range}")
        self.count_in_domain = count_in_domain
        self.count_ood = count_ood
        self.max_number = max_number
        self.target_range = target_range
        self.format_reward = float(format_reward)

    def config_id(self) -> str:
        return f"{self.count_in_domain}{self.count_ood}{self.max_number}{self.target_range}"

    def _draw(self, rng: random.Random, split: str) -> tuple[Hashable, dict[str, Any]] | None:
        lo, hi = self.count_ood if split == "ood_numbers" else self.count_in_domain
        numbers = [rng.randint(1, self.max_number) for _ in range(rng.randint(lo, hi))]
        made = _random_solution(rng, numbers)
        if made is None:
            return None
        target, solution = made
        if not (self.target_range[0] <= target <= self.target_range[1]) or target in numbers:
            return None
        key = (tuple(sorted(numbers)), target)
        prompt = (
            f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
            "You may use +, -, *, / and parentheses, and each number at most once."
        )
        fields = {
            "prompt": prompt,
            "answer": str(target),
            "id": f"countdown/{split}/{','.join(map(str, numbers))}->{target}",
            "metadata": {"numbers": numbers, "target": target, "solution": solution},
        }
        return key, fields

    def check(self, example: Example, completion: str) -> Score:
        """1 for a valid expression over the given numbers equal to the target (see module docstring)."""
        expression = extract_expression(completion)
        if expression is None:
            return WRONG
        try:
            value = check_countdown_expression(expression, example.metadata["numbers"])
        except ExpressionError:
            return WRONG
        if value == int(example.metadata["target"]):
            return Score(1.0, True)
        return Score(self.format_reward, False)


def _random_solution(rng: random.Random, numbers: list[int]) -> tuple[int, str] | None:
    """Combine all `numbers` with random operations into one positive integer: (value, expression)."""
    pool: list[tuple[int, str]] = [(x, str(x)) for x in numbers]
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (a, sa), (b, sb) = pool[i], pool[j]
        pool = [p for k, p in enumerate(pool) if k not in (i, j)]
        op = rng.choice("+-*/")
        if op in "-/" and a < b:
            (a, sa), (b, sb) = (b, sb), (a, sa)
        if op == "-" and a == b or op == "/" and (b in (0, 1) or a % b) or op == "*" and (a == 1 or b == 1):
            op = "+"
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        if value <= 0 or value > 10_000:
            return None
        pool.append((value, f"({sa} {op} {sb})"))
    value, expression = pool[0]
    return value, expression[1:-1] if expression.startswith("(") else expression
