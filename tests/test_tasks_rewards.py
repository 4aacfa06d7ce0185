"""Answer extraction, math-verify rewards, score_batch, and the verifier pool under hung/crashed workers."""

from __future__ import annotations

import os
import time

import pytest

from kljax.tasks import (
    VerifierPool,
    _testing,
    answers,
    check_choice,
    check_integer,
    check_math,
    get_task,
    loaders,
    score_batch,
)
from kljax.tasks.base import Example
from kljax.tasks.rewards import score_one


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, timeout_s=10.0) as p:
        yield p


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{x^{2} + \\sqrt{y_{1}}}", "x^{2} + \\sqrt{y_{1}}"),
        ("\\boxed{\\boxed{5}}", "5"),
        ("$\\boxed 7$", "7"),
        ("\\fbox{3}", "3"),
        ("work...\nAnswer: $1,234$.\nThanks", "1,234"),
        ("Final answer: -12", "-12"),
        ("steps\n#### 72", "72"),
        ("it is 5, or maybe 6.5 apples", "6.5"),
        ("\\boxed{5", "5"),  # an unclosed box falls through to the last number
        ("no answer at all", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, answer):
    assert answers.extract_final_answer(text) == answer


def test_integer_and_number_parsing():
    assert [answers.parse_integer(s) for s in ("1,234", "18.00", "\\$18", "47 + 38 = 85", "85 apples")] == [
        1234,
        18,
        18,
        85,
        85,
    ]
    assert [answers.parse_integer(s) for s in ("18.5", "x", "", "1/0", "3 + 4", "9" * 5000)] == [None] * 6
    assert answers.parse_number("-\\frac{3}{4}") == answers.parse_number("-0.75") == answers.parse_number("-3/4")
    assert check_integer("\\boxed{72}", "72").correct and not check_integer("\\boxed{71}", "72").correct


@pytest.mark.parametrize(
    "completion, correct",
    [
        ("The answer is (B).", True),
        ("\\boxed{B}", True),
        ("Answer: b) second", True),
        ("Answer: second", True),  # the text of the choice
        ("\\boxed{(C)}", False),
        ("Answer: E", False),  # not a choice
        ("I think B is plausible but", False),  # no final answer stated
    ],
)
def test_choice_reward(completion, correct):
    assert check_choice(completion, "B", ["first", "second", "third", "fourth"]).correct is correct


@pytest.mark.parametrize(
    "completion, target, correct",
    [
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("so the answer is \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}", True),
        ("Answer: 1/2", "\\frac{1}{2}", True),
        ("\\boxed{0.6}", "\\frac{1}{2}", False),
        ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
        ("we get $x = 4$ in the end", "4", True),  # no boxed/Answer: math-verify reads the tail
        ("nothing", "4", False),
    ],
)
def test_check_math(completion, target, correct):
    assert check_math(completion, target).correct is correct


def test_math500_answers_through_the_pool(pool):
    data_dir = loaders.default_data_dir()
    if data_dir is None or not data_dir.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"under CI: offline data sets not found (${loaders.DATA_DIR_ENV} / ../shared/data)")
        pytest.skip("offline data sets not found (set $KLJAX_DATA_DIR or see shared/data/README.md)")
    task = get_task("math500")
    examples = task.examples("test", n=12, seed=0)
    right = [f"Reasoning...\n\nThe final answer is $\\boxed{{{ex.answer}}}$." for ex in examples]
    wrong = [f"\\boxed{{{ex.answer} + 1}}" for ex in examples]
    rewards, correct = score_batch(task, examples * 2, right + wrong, pool=pool)
    assert rewards[:12].tolist() == [1.0] * 12 and correct[:12].all()
    assert not correct[12:].any()


def test_score_batch_contract(pool):
    task = get_task("arithmetic")
    examples = task.examples("test", n=3)
    rewards, correct = score_batch(task, examples, [f"\\boxed{{{examples[0].answer}}}", None, 17])  # type: ignore[list-item]
    assert rewards.shape == (3,) and rewards[0] == 1.0 and rewards[1:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="3 examples but 2 completions"):
        score_batch(task, examples, ["a", "b"])
    assert score_batch(get_task("math500"), [], [], pool=pool)[0].shape == (0,)
    math_example = Example("1/2 = ?", "\\frac{1}{2}", "math500", "test", "m")
    rewards, correct = score_batch(get_task("math500"), [math_example] * 2, ["\\boxed{0.5}", None], pool=pool)  # type: ignore[list-item]
    assert rewards.tolist() == [1.0, 0.0] and correct.tolist() == [True, False]


def test_task_score_uses_the_default_pool():
    math_example = Example("1/2 = ?", "\\frac{1}{2}", "math", "test", "m")
    assert score_one(get_task("math"), math_example, "\\boxed{\\frac{2}{4}}").correct
    assert score_one(get_task("math"), math_example, "\\boxed{3}").reward == 0.0


def test_hung_and_crashed_workers_are_replaced_without_losing_the_batch():
    task = _testing.FaultyArithmeticTask()
    examples = task.examples("test", n=8, seed=1)
    completions = [f"\\boxed{{{ex.answer}}}" for ex in examples]
    completions[1], completions[4], completions[6] = _testing.HANG, _testing.CRASH, _testing.RAISE
    with VerifierPool(num_workers=2, timeout_s=2.0) as faulty_pool:
        start = time.monotonic()
        rewards, correct = score_batch(task, examples, completions, pool=faulty_pool)
        elapsed = time.monotonic() - start
        assert rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
        assert correct.tolist() == [r == 1.0 for r in rewards]
        assert faulty_pool.restarts == 2  # the hung one and the crashed one; a raise keeps its worker
        assert elapsed < 30
        # the pool keeps working, and a whole batch of hangs costs about one time limit per worker
        outcomes = faulty_pool.map(task.check, [(examples[0], _testing.HANG)] * 2 + [(examples[0], completions[0])])
        assert [o.ok for o in outcomes] == [False, False, True]
        assert "timed out after 2s" in outcomes[0].error and outcomes[2].value.correct
    assert faulty_pool.closed
    with pytest.raises(RuntimeError, match="closed"):
        faulty_pool.map(task.check, [])
