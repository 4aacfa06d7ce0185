"""Integer arithmetic with an in-domain distribution and two out-of-domain shifts.

Splits (one task, `arithmetic`, with a split argument):
  train, test   a + b and a - b with `digits`-digit operands (default 2: 10..99); a >= b for
                subtraction, so answers are >= 0. Disjoint: a hash of the problem picks its split.
  ood_digits    the same operations with `ood_digits`-digit operands (default 3: 100..999).
  ood_ops       new operations on in-domain operands: a * b, and exact division (a * b) / b.
Every problem is keyed by (a, op, b); OOD keys never occur in-domain (other operand sizes or other
operations), which the tests check.

Reward: exact integer match of the completion's final answer (`answers.extract_final_answer`:
last \\boxed{}, else "Answer:", else "####", else the last number), 1.0 or 0.0.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Any

from kljax.tasks import answers
from kljax.tasks.base import Example, GeneratedTask, Score

_SYMBOL = {"+": "+", "-": "-", "*": "*", "/": "/"}


class ArithmeticTask(GeneratedTask):
    """Integer arithmetic (see the module docstring for the splits)."""

    name = "arithmetic"
    splits = ("train", "test", "ood_digits", "ood_ops")
    answer_format = "answer_line"  # "Answer: N": SmolLM2-135M follows it better than \boxed{}
    default_size = {"train": 10000, "test": 500, "ood_digits": 500, "ood_ops": 500}

    def __init__(self, digits: int = 2, ood_digits: int = 3):
        if not (1 <= digits < ood_digits <= 18):
            raise ValueError(f"need 1 <= digits < ood_digits <= 18, got digits={digits}, ood_digits={ood_digits}")
        self.digits = digits
        self.ood_digits = ood_digits

    def config_id(self) -> str:
        return f"d{self.digits}o{self.ood_digits}"

    @staticmethod
    def _operand(rng: random.Random, digits: int) -> int:
        return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)

    def _draw(self, rng: random.Random, split: str) -> tuple[Hashable, dict[str, Any]] | None:
        digits = self.ood_digits if split == "ood_digits" else self.digits
        a, b = self._operand(rng, digits), self._operand(rng, digits)
        if split == "ood_ops":
            op = rng.choice("*/")
            if op == "/":
                if b == 0:
                    return None
                a = a * b  # exact division: the quotient is the in-domain operand a
        else:
            op = rng.choice("+-")
            if op == "-" and a < b:
                a, b = b, a
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
        key = (a, op, b)
        fields = {
            "prompt": f"What is {a} {_SYMBOL[op]} {b}?",
            "answer": str(value),
            "id": f"arithmetic/{split}/{a}{op}{b}",
            "metadata": {"a": a, "op": op, "b": b},
        }
        return key, fields

    def check(self, example: Example, completion: str) -> Score:
        """1.0 when the final answer is exactly the integer answer."""
        correct = answers.integers_equal(answers.extract_final_answer(completion), example.answer)
        return Score(float(correct), correct)
