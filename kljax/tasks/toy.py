"""`repeat_digit`: a toy task a tiny random model learns in a few dozen RL steps (tests, tiny configs).

The prompt is a digit and a question mark ("7?"); the reward is the fraction of the response's
characters that are that digit (0 for an empty response), correct when the response is non-empty
and all of it is the digit. Dense partial credit makes the signal visible from random init.
"""

from __future__ import annotations

import random

from kljax.tasks.base import Example, Score, Task


class RepeatDigitTask(Task):
    name = "repeat_digit"
    splits = ("train", "test")

    def examples(self, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
        self.validate_split(split)
        n = 64 if n is None else n
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        rng = random.Random(f"{self.name}/{split}/{seed}")
        out = []
        for i in range(n):
            digit = str(rng.randrange(10))
            out.append(Example(prompt=f"{digit}?", answer=digit, task=self.name, split=split, id=f"{split}-{i}"))
        return out

    def check(self, example: Example, completion: str) -> Score:
        text = completion.strip()
        if not text:
            return Score(0.0, False)
        hits = sum(ch == example.answer for ch in text)
        return Score(hits / len(text), hits == len(text))
