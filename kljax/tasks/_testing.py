"""Test-only hook: a task whose check hangs, crashes its process, or raises on marked completions.

It scores through the verifier pool like math-verify tasks do, so the tests can check that a hung or
crashed worker is replaced without losing the other results of a batch. Not for real use.
"""

from __future__ import annotations

import os
import time

from kljax.tasks.arithmetic import ArithmeticTask
from kljax.tasks.base import Example, Score

HANG = "<<test: hang>>"
CRASH = "<<test: crash>>"
RAISE = "<<test: raise>>"


class FaultyArithmeticTask(ArithmeticTask):
    """Arithmetic scored in worker processes, with injectable faults (HANG, CRASH, RAISE)."""

    name = "faulty_arithmetic"
    uses_verifier_pool = True

    def check(self, example: Example, completion: str) -> Score:
        if completion == HANG:
            time.sleep(3600)
        if completion == CRASH:
            os._exit(13)
        if completion == RAISE:
            raise RuntimeError("injected failure")
        return super().check(example, completion)
