"""The countdown expression parser: what it accepts, what it refuses, and that it never evaluates code."""

from __future__ import annotations

import builtins
from fractions import Fraction

import pytest

from kljax.tasks import expression as ex
from kljax.tasks.base import Example
from kljax.tasks.countdown import CountdownTask

NUMBERS = [3, 7, 25, 50]


@pytest.mark.parametrize(
    "text, value",
    [
        ("3 + 7", 10),
        ("(50 - 25) * 3", 75),
        ("50 / (7 - 3)", Fraction(25, 2)),
        ("$25 \\times 3 - 50 \\div 7$", Fraction(475, 7)),
        ("25 × 3 − 7", 68),
        ("\\left(50 - 7\\right) * 3", 129),
        ("[(50 + 25) / 3] - 7", 18),
        ("((((3))))", 3),
    ],
)
def test_accepts_arithmetic_over_given_numbers(text, value):
    assert ex.check_countdown_expression(text, NUMBERS) == value
    tree = ex.parse(text)
    assert ex.parse(ex.to_string(tree)) == tree


@pytest.mark.parametrize(
    "text, reason",
    [
        ("abs(3) + 7", "names are not allowed"),
        ("__import__('os').system('true')", "names are not allowed"),
        ("x + 3", "names are not allowed"),
        ("(3).real", "attribute access"),
        ("3 .__class__", "attribute access"),
        ("3.5 + 7", "decimal points"),
        ("3 ** 999999999", "exponentiation"),
        ("25 ^ 50", "exponentiation"),
        ("(" * 40 + "3" + ")" * 40, "nested deeper"),
        ("3 + 8", "not one of the given numbers"),
        ("3 + 3", "used 2 times"),
        ("25 * 3 + 7 - 3", "used 2 times"),
        ("-3 + 7", "unary"),
        ("3 + -7", "unary"),
        ("50 / (3 - 3)", "used 2 times"),
        ("1234567 + 3", "digits"),
        ("3 + ", "end of expression"),
        ("(3 + 7", "expected"),
        ("3 7", "after a complete expression"),
        ("3; 7", "unexpected character"),
        ("", "empty"),
        ("+".join(["3"] * 80), "tokens"),
        ("3 +" + " " * 400 + "7", "longer than"),
        ("3 @ 7", "unexpected character"),
        ("lambda: 3", "names are not allowed"),
    ],
)
def test_refuses_everything_else(text, reason):
    with pytest.raises(ex.ExpressionError, match=reason):
        ex.check_countdown_expression(text, NUMBERS)


def test_division_by_zero_is_an_expression_error():
    with pytest.raises(ex.ExpressionError, match="division by zero"):
        ex.check_countdown_expression("7 / (25 - 25)", [7, 25, 25])


def test_non_string_input():
    with pytest.raises(ex.ExpressionError):
        ex.parse(None)  # type: ignore[arg-type]


def test_scoring_never_calls_eval_or_exec(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called on model output")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    example = Example("...", "75", "countdown", "test", "x", {"numbers": NUMBERS, "target": 75, "solution": ""})
    task = CountdownTask()
    assert task.check(example, "\\boxed{(50 - 25) * 3}").correct
    assert not task.check(example, "\\boxed{__import__('os').system('echo pwned')}").correct
