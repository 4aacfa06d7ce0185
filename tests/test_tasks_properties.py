"""Property tests: reward functions never raise and return within their time limit on hostile input."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kljax.tasks import VerifierPool, answers, check_choice, check_integer, get_task, score_batch
from kljax.tasks.base import Example
from kljax.tasks.dm_math import answers_match
from kljax.tasks.expression import ExpressionError, check_countdown_expression
from kljax.tasks.rewards import score_one

IN_PROCESS_LIMIT_S = 1.0  # the in-process checks are linear-time; far below this on any input here
POOL_LIMIT_S = 5.0

ARITHMETIC = Example("What is 47 + 38?", "85", "arithmetic", "test", "a", {})
COUNTDOWN = Example("...", "24", "countdown", "test", "c", {"numbers": [4, 6, 8, 3], "target": 24, "solution": ""})
MMLU = Example("Q", "B", "mmlu_college_physics", "test", "m", {"choices": ["w", "x", "y", "z"]})
MATH = Example("Q", "\\frac{1}{2}", "math500", "test", "q", {})


def _braces(depth: int, middle: str) -> str:
    return "\\boxed{" + "{" * depth + middle + "}" * depth + "}"


hostile = st.one_of(
    st.text(max_size=2000),
    st.integers(min_value=-(10**300), max_value=10**300).map(lambda n: f"\\boxed{{{n}}}"),
    st.integers(min_value=0, max_value=20000).map(lambda n: "9" * n),
    st.builds(_braces, st.integers(0, 20000), st.text(max_size=20)),
    st.integers(0, 20000).map(lambda n: "\\boxed{" * n),
    st.builds(lambda n, s: ("Answer:" + " " * n + s) * 3, st.integers(0, 5000), st.text(max_size=10)),
    st.builds(lambda n: "(" * n + "4" + ")" * n, st.integers(0, 5000)).map(lambda e: f"\\boxed{{{e}}}"),
    st.sampled_from(["\\boxed{4 ** 99999999}", "\\boxed{__import__('os')}", "\\boxed{(4).real}", "#### 1e999"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile)
def test_in_process_rewards_never_raise_and_are_fast(completion):
    arithmetic, countdown = get_task("arithmetic"), get_task("countdown")
    start = time.perf_counter()
    scores = [
        score_one(arithmetic, ARITHMETIC, completion),
        score_one(countdown, COUNTDOWN, completion),
        check_integer(completion, "85"),
        check_choice(completion, "B", MMLU.metadata["choices"]),
        get_task("gsm8k").check(ARITHMETIC, completion),
    ]
    answers.extract_final_answer(completion)
    answers_match(completion, "-3, 1/2")
    answers_match(completion, "True")
    assert time.perf_counter() - start < IN_PROCESS_LIMIT_S
    for score in scores:
        assert score.reward in (0.0, 1.0) and score.correct == (score.reward == 1.0)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-*/()^. xa_[]×÷\\")), max_size=400) | st.text(max_size=400))
def test_expression_parser_only_raises_expression_errors(text):
    try:
        value = check_countdown_expression(text, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    except ExpressionError:
        return
    assert value.denominator >= 1


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, timeout_s=POOL_LIMIT_S) as p:
        yield p


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hostile, min_size=1, max_size=6))
def test_math_verify_rewards_return_within_the_time_limit(pool, completions):
    task = get_task("math500")
    start = time.perf_counter()
    rewards, correct = score_batch(task, [MATH] * len(completions), completions, pool=pool)
    # every item finishes or is cut at POOL_LIMIT_S; a replaced worker needs a few seconds to start
    assert time.perf_counter() - start < len(completions) * POOL_LIMIT_S + 30
    assert rewards.shape == (len(completions),) and set(rewards.tolist()) <= {0.0, 1.0}
    assert (correct == (rewards == 1.0)).all()
