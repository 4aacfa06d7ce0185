"""Generated tasks: deterministic splits, disjoint in-domain/OOD splits, rewards on hand-written completions."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from kljax.tasks import get_task, score_batch
from kljax.tasks.arithmetic import ArithmeticTask
from kljax.tasks.base import Example
from kljax.tasks.countdown import CountdownTask, extract_expression
from kljax.tasks.expression import check_countdown_expression


def _keys(examples: list[Example]) -> set[str]:
    return {ex.id.split("/", 2)[2] for ex in examples}


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_generated_splits_are_deterministic_per_seed(name):
    task = get_task(name)
    for split in task.splits:
        first = task.examples(split, n=50, seed=3)
        assert first == get_task(name).examples(split, n=50, seed=3)
        assert first != task.examples(split, n=50, seed=4)
        assert len({ex.id for ex in first}) == 50
        assert all(ex.task == name and ex.split == split and ex.prompt and ex.answer for ex in first)
        # a prefix of a longer draw with the same seed: n does not reshuffle earlier problems
        assert task.examples(split, n=20, seed=3) == first[:20]


def test_arithmetic_splits_are_disjoint_and_shifted():
    task = ArithmeticTask()
    train, test = task.examples("train", n=4000), task.examples("test", n=500)
    ood_digits, ood_ops = task.examples("ood_digits", n=500), task.examples("ood_ops", n=500)
    assert not _keys(train) & _keys(test)
    in_domain = train + test
    assert all(10 <= ex.metadata["a"] <= 99 and 10 <= ex.metadata["b"] <= 99 for ex in in_domain)
    assert {ex.metadata["op"] for ex in in_domain} == {"+", "-"}
    assert all(int(ex.answer) >= 0 for ex in in_domain)
    assert all(100 <= ex.metadata["a"] <= 999 and 100 <= ex.metadata["b"] <= 999 for ex in ood_digits)
    assert {ex.metadata["op"] for ex in ood_digits} == {"+", "-"}
    assert {ex.metadata["op"] for ex in ood_ops} == {"*", "/"}
    for ex in ood_ops:  # in-domain operands; exact division
        a, op, b = ex.metadata["a"], ex.metadata["op"], ex.metadata["b"]
        assert 10 <= b <= 99 and (10 <= a <= 99 if op == "*" else a % b == 0 and 10 <= a // b <= 99)
        assert int(ex.answer) == (a * b if op == "*" else a // b)
    keys = [_keys(s) for s in (train + test, ood_digits, ood_ops)]
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]


def test_countdown_splits_are_disjoint_and_solvable():
    task = CountdownTask()
    train, test, ood = task.examples("train", n=1500), task.examples("test", n=200), task.examples("ood_numbers", n=200)
    assert not _keys(train) & _keys(test)
    assert all(len(ex.metadata["numbers"]) in (3, 4) for ex in train + test)
    assert all(len(ex.metadata["numbers"]) in (5, 6) for ex in ood)
    for ex in train[:300] + test + ood:
        numbers, target = ex.metadata["numbers"], ex.metadata["target"]
        assert 1 <= target <= 100 and target not in numbers and ex.answer == str(target)
        assert check_countdown_expression(ex.metadata["solution"], numbers) == target
    rewards, correct = score_batch(task, test, [f"\\boxed{{{ex.metadata['solution']}}}" for ex in test])
    assert rewards.dtype == np.float32 and correct.dtype == bool
    assert rewards.tolist() == [1.0] * len(test) and correct.all()


def test_too_many_examples_or_bad_split_fail_clearly():
    with pytest.raises(ValueError, match="distinct problems"):
        ArithmeticTask(digits=1, ood_digits=2).examples("test", n=500)
    with pytest.raises(ValueError, match=r"valid splits: \['train', 'test', 'ood_digits', 'ood_ops'\]"):
        ArithmeticTask().examples("validation")
    with pytest.raises(ValueError):
        ArithmeticTask(digits=3, ood_digits=2)


ARITHMETIC = Example("What is 47 + 38?", "85", "arithmetic", "test", "x", {})


@pytest.mark.parametrize(
    "completion, correct",
    [
        ("47 + 38 = 85, so the answer is \\boxed{85}.", True),
        ("Let me add: 40 + 30 = 70, 7 + 8 = 15.\nAnswer: 85", True),
        ("47 + 38 = 85\n#### 85", True),
        ("The sum is 85.", True),
        ("\\boxed{85.0}", True),
        ("\\boxed{84} but maybe 85", False),  # the boxed answer wins over a later number
        ("\\boxed{85.5}", False),
        ("Answer: eighty-five", False),
        ("", False),
        ("\\boxed{", False),
        ("I do not know.", False),
    ],
)
def test_arithmetic_reward(completion, correct):
    score = ArithmeticTask().check(ARITHMETIC, completion)
    assert score.correct is correct and score.reward == float(correct)


COUNTDOWN = Example("...", "24", "countdown", "test", "x", {"numbers": [4, 6, 8, 3], "target": 24, "solution": ""})


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("\\boxed{(8 - 6) * 4 * 3}", 1.0),
        ("<answer>3 * 8 * (6 - 4)</answer> wait, no: <answer>(8 - 6) * 3 * 4</answer>", 1.0),
        ("Answer: (8 - 4) * 6 = 24", 1.0),
        ("\\boxed{24 = 4 * 6}", 1.0),  # a subset of the numbers is allowed
        ("\\boxed{4 \\times 6}", 1.0),
        ("\\boxed{(6 / 4) * 8 * 2}", 0.0),  # 2 is not given
        ("\\boxed{4 * 6 * 8 / 8}", 0.0),  # 8 used twice
        ("\\boxed{4 + 6 + 8 + 3}", 0.0),  # valid but 21
        ("<answer>8 * 3 * (6 - 4)</answer>", 0.0),  # 48
        ("\\boxed{24}", 0.0),  # not a given number
        ("\\boxed{4 ** 2 + 8}", 0.0),
        ("(8 - 6) * 4 * 3", 0.0),  # no answer marker
        ("", 0.0),
    ],
)
def test_countdown_reward(completion, reward):
    assert CountdownTask().check(COUNTDOWN, completion).reward == reward


def test_countdown_format_reward_and_extraction():
    task = CountdownTask(format_reward=0.1)
    assert task.check(COUNTDOWN, "\\boxed{4 + 6 + 8 + 3}").reward == pytest.approx(0.1)
    assert task.check(COUNTDOWN, "\\boxed{4 + 4}").reward == 0.0  # invalid: reused number
    assert extract_expression("so $\\boxed{(1+2)*3 = 9}$.") == "(1+2)*3"
    assert extract_expression("nothing here") is None


def test_dm_math_task_if_the_package_works():
    pytest.importorskip("mathematics_dataset")
    from kljax.tasks.dm_math import answers_match

    task = get_task("dm_math", modules=("arithmetic", "numbers__gcd", "comparison__sort"))
    state = random.getstate(), np.random.get_state()[1].copy()
    train, test = task.examples("train", n=60, seed=1), task.examples("test", n=30, seed=1)
    assert random.getstate() == state[0] and (np.random.get_state()[1] == state[1]).all()
    assert train == task.examples("train", n=60, seed=1)
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in test}
    ood = task.examples("ood", n=10, seed=1)
    assert all(ex.metadata["module"].startswith(("arithmetic", "comparison")) for ex in ood)
    rewards, _ = score_batch(task, train, [f"\\boxed{{{ex.answer}}}" for ex in train])
    assert rewards.tolist() == [1.0] * len(train)
    assert answers_match("0.5", "1/2") and answers_match("yes", "True") and answers_match("-3, 2", "-3,2")
    assert not answers_match("False", "True") and not answers_match("2, -3", "-3, 2") and not answers_match("7", "8")


_FINGERPRINT = """
import hashlib, json, sys, warnings
warnings.simplefilter("ignore")
from kljax.tasks import get_task
out = {}
for name, kwargs in json.loads(sys.argv[1]):
    task = get_task(name, **kwargs)
    examples = [ex for split in task.splits for ex in task.examples(split, n=40, seed=5)]
    out[name] = hashlib.sha256(repr([(e.prompt, e.answer, e.id) for e in examples]).encode()).hexdigest()
print(json.dumps(out))
"""


def test_generated_splits_are_the_same_in_every_process():
    """Same seed, same problems, whatever the process's string-hash seed (PYTHONHASHSEED)."""
    specs = [("arithmetic", {}), ("countdown", {})]
    try:
        import mathematics_dataset  # noqa: F401

        specs.append(("dm_math", {"modules": ["algebra", "numbers", "polynomials", "comparison"]}))
    except ImportError:
        pass
    runs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT, json.dumps(specs)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] and set(runs[0]) == {name for name, _ in specs}
