"""Reward functions from the user's code and the built-ins: loading, weights, per-function metrics, and
every failure (raise, wrong length, non-number, non-finite, timeout) stopping with the function and
example named, or skipped and counted with reward.on_error=skip."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from kljax.config import load_run_config, with_overrides
from kljax.tasks import get_task, score_batch
from kljax.tasks.base import Example, Score
from kljax.tasks.reward_functions import parse_specs
from kljax.train.reward_set import RewardFunctionError, RewardSet

USER_CODE = textwrap.dedent('''
    import math, time

    def length(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    def uses_columns(prompts, completions, answer, level, **kw):
        return [float(c == a) + 0.1 * lv for c, a, lv in zip(completions, answer, level)]

    def raises_on_bad(prompts, completions, **kw):
        if any("bad" in c for c in completions):
            raise RuntimeError("cannot score")
        return [1.0] * len(completions)

    def short(prompts, completions, **kw):
        return [1.0]

    def text(prompts, completions, **kw):
        return ["high" if "bad" in c else 1.0 for c in completions]

    def nan_on_bad(prompts, completions, **kw):
        return [math.nan if "bad" in c else 1.0 for c in completions]

    def hangs_on_bad(prompts, completions, **kw):
        if any("bad" in c for c in completions):
            time.sleep(60)
        return [2.0] * len(completions)
''')

EXAMPLES = [Example(f"p{i}", str(i), "jsonl", "train", f"train-{i}", {"columns": {"answer": str(i), "level": i}})
            for i in range(3)]


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_CODE)
    return path


def reward_set(user_file, names, **reward):
    c = load_run_config("configs/tiny.py")
    c = with_overrides(c, [f"--config.reward.functions={','.join(f'{user_file}:{n}' for n in names)}",
                            *[f"--config.reward.{k}={v}" for k, v in reward.items()]])
    return RewardSet.from_config(c, get_task("repeat_digit"), columns=["answer", "level"])


def test_weighted_sum_and_per_function_metrics(user_file):
    rs = reward_set(user_file, ["length", "uses_columns"], weights="(0.5,2.0)")
    result = rs(EXAMPLES, ["0", "xx", "2"])
    assert result.parts["length"].tolist() == [1.0, 2.0, 1.0]
    np.testing.assert_allclose(result.parts["uses_columns"], [1.0, 0.1, 1.2], rtol=1e-6)
    np.testing.assert_allclose(result.rewards, 0.5 * result.parts["length"] + 2 * result.parts["uses_columns"],
                               rtol=1e-6)
    assert result.metrics["rewards/length/mean"] == pytest.approx(4 / 3)
    assert result.metrics["reward_errors"] == 0


def test_builtins_are_named_like_functions(user_file):
    refs = parse_specs("exact_match,format")
    rs = RewardSet(get_task("repeat_digit"), [(r.name, r) for r in refs], [1.0, 1.0])
    result = rs(EXAMPLES, ["\\boxed{0}", "Answer: 7", "nothing"])
    assert result.parts["exact_match"].tolist() == [1.0, 0.0, 0.0]
    assert result.parts["format"].tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"'nope' is neither a built-in \['exact_match', 'format', 'math_answer'\]"):
        parse_specs("nope")
    with pytest.raises(ValueError, match=r"has no function 'missing' \(it has \[.*'length'"):
        parse_specs(f"{user_file}:missing")
    with pytest.raises(ValueError, match=r"file 'absent\.py'.*does not exist"):
        parse_specs("absent.py:fn")
    with pytest.raises(ValueError, match=r"could not import 'no_such_module_xyz'"):
        parse_specs("no_such_module_xyz:fn")


@pytest.mark.parametrize("name, message", [
    ("raises_on_bad", r"'raises_on_bad' .* raised RuntimeError: cannot score on example train-1"),
    ("short", r"'short' .* wrong length for a batch of 3"),
    ("text", r"'text' .* non-number str 'high' on example train-1"),
    ("nan_on_bad", r"'nan_on_bad' .* non-finite value nan on example train-1"),
])
def test_failures_stop_naming_function_and_example(user_file, name, message):
    rs = reward_set(user_file, [name])
    with pytest.raises(RewardFunctionError, match=message + r".*reward\.on_error=skip"):
        rs(EXAMPLES, ["ok", "bad", "ok"])


def test_skip_scores_failed_sequences_zero_and_counts_them(user_file):
    rs = reward_set(user_file, ["raises_on_bad", "nan_on_bad", "short"], on_error="skip")
    result = rs(EXAMPLES, ["ok", "bad", "ok"])
    assert result.parts["raises_on_bad"].tolist() == [1.0, 0.0, 1.0]
    assert result.parts["nan_on_bad"].tolist() == [1.0, 0.0, 1.0]
    # wrong for the batch, right for each item alone: the batch's output is unusable, all of it scores 0
    assert result.parts["short"].tolist() == [0.0, 0.0, 0.0] and result.metrics["rewards/short/errors"] == 3
    assert result.metrics["rewards/raises_on_bad/errors"] == 1 and result.metrics["reward_errors"] == 5
    with pytest.raises(ValueError, match=r"reward\.on_error='ignore' is not valid; choose one of \['raise', 'skip'\]"):
        reward_set(user_file, ["length"], on_error="ignore")
    with pytest.raises(ValueError, match=r"reward\.weights=.* has 2 values for 1 reward functions"):
        reward_set(user_file, ["length"], weights="(1.0,2.0)")


def test_time_limit_in_worker_processes(user_file):
    """A hang costs one time limit; the items around it are scored (5 s: a worker is restarted and the
    module imported again within the budget even on a loaded machine)."""
    rs = reward_set(user_file, ["hangs_on_bad"], timeout_s=5.0, on_error="skip")
    try:
        result = rs(EXAMPLES, ["ok", "bad", "ok"])
        assert result.parts["hangs_on_bad"].tolist() == [2.0, 0.0, 2.0]
        assert result.metrics["rewards/hangs_on_bad/errors"] == 1
    finally:
        rs.close()


class ReturnsFloat(type(get_task("arithmetic"))):
    name = "returns_float"

    def check(self, example, completion):
        return 1.0


class Raises(type(get_task("arithmetic"))):
    name = "raises"

    def check(self, example, completion):
        raise KeyError("numbers")


def test_task_check_that_raises_or_returns_a_float_is_an_error():
    examples = get_task("arithmetic").examples("test", n=2)
    with pytest.raises(ValueError, match=r"'returns_float': check\(\) returned float 1\.0.*Score\(reward, correct\)"):
        score_batch(ReturnsFloat(), examples, ["a", "b"])
    with pytest.raises(ValueError, match=r"task 'raises': check\(\) raised KeyError"):
        score_batch(Raises(), examples, ["a", "b"])
    assert score_batch(get_task("arithmetic"), examples, ["a", None])[0].tolist() == [0.0, 0.0]  # model output
    assert Score(1.0, True).reward == 1.0
