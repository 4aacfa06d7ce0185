"""Reward functions written for TRL run unchanged (called by keyword with prompts, completions,
completion_ids, trainer_state and every column; None = no score; async awaited; trl.rewards' own),
every signature is bound before the model loads, and a reward function cannot hurt the run: its own
copies of the arguments, a hanging, exiting or dying function and its module's import named in one
line, no code from the working directory, overflow named, bad reward settings refused."""

from __future__ import annotations

import asyncio
import json
import textwrap

import numpy as np
import pytest

from kljax.config import load_run_config, with_overrides
from kljax.errors import UserError
from kljax.tasks import get_task
from kljax.tasks.base import Example
from kljax.tasks.files import FileTask
from kljax.tasks.pool import VerifierPool
from kljax.train.reward_set import RewardFunctionError, RewardSet


def examples(n=3, **columns):
    return [Example(f"{i}+1=", str(i + 1), "jsonl", "train", f"train-{i}",
                    {"columns": {"solution": str(i + 1), **{k: v[i] for k, v in columns.items()}}})
            for i in range(n)]


def reward_set(*functions, weights=None, columns=("solution", "answer"), **kw):
    named = [(getattr(f, "__name__", str(f)), f) for f in functions]
    return RewardSet(get_task("repeat_digit"), named, weights or [1.0] * len(named), columns=columns, **kw)


# ------------------------------------------------------------------ TRL's convention


def completions_only(completions, **kwargs):  # TRL's usual signature: failed "1 positional argument" before
    return [float(len(c)) for c in completions]


def with_column(completions, solution, **kwargs):  # failed "multiple values for argument" before
    return [float(c == s) for c, s in zip(completions, solution, strict=True)]


def with_ids_and_state(completions, completion_ids, trainer_state, **kwargs):
    return [len(ids) + 100.0 * trainer_state.global_step for ids in completion_ids]


def none_for_long(completions, **kwargs):
    return [None if len(c) > 1 else 1.0 for c in completions]


async def async_reward(completions, **kwargs):  # returned a coroutine before
    await asyncio.sleep(0)
    return [2.0] * len(completions)


def test_trl_signatures_called_by_keyword_with_ids_state_none_and_async():
    rs = reward_set(completions_only, with_column, with_ids_and_state, none_for_long, async_reward)
    from kljax.tasks.reward_functions import TrainerState

    rs.state = TrainerState(global_step=3, epoch=0.5, max_steps=10)
    result = rs(examples(), ["1", "22", "x"], completion_ids=[[5], [6, 6], [7]])
    assert result.parts["completions_only"].tolist() == [1.0, 2.0, 1.0]
    assert result.parts["with_column"].tolist() == [1.0, 0.0, 0.0]
    assert result.parts["with_ids_and_state"].tolist() == [301.0, 302.0, 301.0]
    assert result.parts["async_reward"].tolist() == [2.0, 2.0, 2.0]
    # None: no score for that sample, left out of its sum and of the function's mean
    assert np.isnan(result.parts["none_for_long"][1]) and result.metrics["rewards/none_for_long/mean"] == 1.0
    np.testing.assert_allclose(result.rewards, [1 + 1 + 301 + 1 + 2, 2 + 0 + 302 + 2, 1 + 0 + 301 + 1 + 2])


def test_a_sample_no_function_scores_is_named():
    with pytest.raises(RewardFunctionError,
                       match=r"no reward function scored example train-1 .*'22'.*\['none_for_long'\]"):
        reward_set(none_for_long)(examples(), ["1", "22", "3"])


def test_conversational_prompts_and_completions_are_messages():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [1.0] * len(completions)

    messages = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{i}+1="}] for i in range(2)]
    exs = [Example(f"{i}+1=", "", "hf", "train", f"train-{i}", {"columns": {}, "messages": messages[i]})
           for i in range(2)]
    reward_set(spy, conversational=True)(exs, ["a", "b"])
    assert seen["prompts"] == messages
    assert seen["completions"] == [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]


def test_trl_rewards_run_unchanged():
    trl_rewards = pytest.importorskip("trl.rewards")
    pytest.importorskip("math_verify")
    rs = reward_set(trl_rewards.think_format_reward, trl_rewards.accuracy_reward, conversational=True)
    exs = [Example("q", "", "hf", "train", f"train-{i}", {"columns": {"solution": s}, "messages": [
        {"role": "user", "content": "q"}]}) for i, s in enumerate(["$\\frac{1}{2}$", "$3$"])]
    result = rs(exs, ["<think>\nhm\n</think>\n\\boxed{\\frac{1}{2}}", "\\boxed{4}"])
    assert result.parts["think_format_reward"].tolist() == [1.0, 0.0]
    assert result.parts["accuracy_reward"].tolist() == [1.0, 0.0]


def test_signatures_are_bound_up_front_naming_the_parameter():
    def wants_typo(completions, answers, **kwargs):
        return [0.0] * len(completions)

    def positional_only(prompts, completions, /):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'wants_typo' .* requires parameter\(s\) \['answers'\] .*columns "
                                         r"\['answer', 'solution'\]"):
        reward_set(wants_typo)
    with pytest.raises(ValueError, match=r"'positional_only' .*positional-only"):
        reward_set(positional_only)
    def no_kwargs(completions, solution):  # gets only what it names
        return [float(c == s) for c, s in zip(completions, solution, strict=True)]

    assert reward_set(no_kwargs)(examples(), ["1", "0", "3"]).parts["no_kwargs"].tolist() == [1.0, 0.0, 1.0]


def test_a_signature_mismatch_stops_kljax_train_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from kljax.cli import main as cli_main
    from kljax.train import run_build

    (tmp_path / "r.py").write_text("def f(completions, answers, **kw):\n    return [0.0] * len(completions)\n")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the reward functions were checked")

    monkeypatch.setattr(run_build, "load_policy", no_model)
    code = cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"),
                     "--config.task.name=jsonl", f"--config.task.path={data}",
                     f"--config.reward.functions={tmp_path / 'r.py'}:f"])
    err = capsys.readouterr().err
    assert code == 2 and "requires parameter(s) ['answers']" in err and "Traceback" not in err


# ------------------------------------------------------------------ a reward function cannot hurt the run


def test_each_function_gets_its_own_copies(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2", "tags": ["a"]}, {"prompt": "2+2=", "answer": "4", "tags": ["b"]}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = FileTask("jsonl", str(path), answer_key="answer", eval_fraction=0)
    seen = []

    def mutates(completions, tags, answer, **kwargs):
        completions[:] = ["\\boxed{2}", "\\boxed{4}"]  # would make every completion right
        tags[0].append("x")
        answer[1] = "0"
        return [0.0] * len(completions)

    def reads(completions, tags, answer, **kwargs):
        seen.append((list(completions), [list(t) for t in tags], list(answer)))
        return [0.0] * len(completions)

    rs = RewardSet(task, [("mutates", mutates), ("reads", reads)], [1.0, 1.0], columns=task.column_names)
    result = rs(task.examples("train"), ["wrong", "no"])
    assert seen == [(["wrong", "no"], [["a"], ["b"]], ["2", "4"])]
    assert result.correct.tolist() == [False, False]  # the accuracy is of what was sampled
    assert [r.values["tags"] for r in task.rows("train")] == [["a"], ["b"]]  # the dataset is as read


def test_a_reward_beyond_float32_names_the_function():
    def huge(completions, **kwargs):
        return [1e300] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"'huge' .* returned 1e\+300, beyond float32's range"):
        reward_set(huge)(examples(), ["1", "2", "3"])

    def big(completions, **kwargs):
        return [3e38] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"weighted reward .* beyond float32's range \(2 \* big"):
        reward_set(big, weights=[2.0])(examples(), ["1", "2", "3"])


@pytest.mark.parametrize("exc, words", [("SystemExit(0)", "called sys.exit"),
                                        ("KeyboardInterrupt()", "was interrupted")])
def test_exit_or_interrupt_in_process_is_one_line_naming_the_function(exc, words):
    def leaves(completions, **kwargs):
        raise eval(exc)  # noqa: S307 - the test's own constant

    with pytest.raises(RewardFunctionError, match=rf"'leaves' .*{words}"):
        reward_set(leaves, on_error="skip")(examples(), ["1", "2", "3"])


@pytest.mark.parametrize("body, words", [("import time\ntime.sleep(60)\n", "timed out after 2s"),
                                         ("import sys\nsys.exit(0)\n", "SystemExit: 0")])
def test_a_reward_files_import_runs_in_a_worker_within_the_time_limit(tmp_path, body, words):
    (tmp_path / "r.py").write_text(body + "def f(completions, **kw):\n    return [0.0] * len(completions)\n")
    c = load_run_config(("configs/tiny.py"), [f"--config.reward.functions={tmp_path / 'r.py'}:f",
                                                          "--config.reward.timeout_s=2.0"])
    with pytest.raises(RewardFunctionError, match=rf"'f' .*could not be loaded in a reward worker process: .*{words}"):
        RewardSet.from_config(c, get_task("repeat_digit"))
    if "exit" in body:  # in this process (no time limit): the exit is named, not obeyed
        c = with_overrides(c, ["--config.reward.timeout_s=None"])
        with pytest.raises(ValueError, match=r"could not import .*SystemExit"):
            RewardSet.from_config(c, get_task("repeat_digit"))


def test_a_hanging_function_costs_about_one_time_limit(tmp_path):
    (tmp_path / "r.py").write_text("import time\ndef hang(completions, **kw):\n    time.sleep(60)\n")
    c = load_run_config(("configs/tiny.py"), [f"--config.reward.functions={tmp_path / 'r.py'}:hang",
                                                          "--config.reward.timeout_s=1.0"])
    rs = RewardSet.from_config(c, get_task("repeat_digit"))
    try:
        with pytest.raises(RewardFunctionError, match=r"'hang' .* timed out after 1s on example train-"):
            rs(examples(16), ["x"] * 16)
        assert rs._pool.restarts <= 2 + rs._pool.num_workers  # not one hung worker per example
    finally:
        rs.close()


def test_with_on_error_skip_hangs_cost_a_bounded_time(tmp_path):
    (tmp_path / "r.py").write_text("import time\ndef hang(completions, **kw):\n"
                                   "    if completions[0] == 'x':\n        time.sleep(60)\n"
                                   "    return [1.0] * len(completions)\n")
    c = load_run_config(("configs/tiny.py"), [f"--config.reward.functions={tmp_path / 'r.py'}:hang",
                                                          "--config.reward.timeout_s=1.0",
                                                          "--config.reward.on_error=skip"])
    rs = RewardSet.from_config(c, get_task("repeat_digit"))
    try:
        result = rs(examples(16), ["x"] * 15 + ["ok"])
        assert result.metrics["rewards/hang/errors"] >= 15 and result.parts["hang"][:15].tolist() == [0.0] * 15
        assert rs._pool.restarts <= 2 + 2 * rs._pool.num_workers + 2  # before: one hung worker per example
    finally:
        rs.close()


def test_pool_workers_never_run_code_from_the_working_directory(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nfrom _json import *\n")
    monkeypatch.chdir(tmp_path)
    with VerifierPool(num_workers=1, timeout_s=30, preload=()) as pool:
        (outcome,) = pool.map(abs, [(-3,)])
    assert outcome.value == 3 and not marker.exists()


def test_a_worker_whose_pool_is_gone_leaves_without_a_traceback(capfd):
    from kljax.tasks.pool import _Worker

    worker = _Worker(("kljax.train.reward_set",))  # the run stops while it imports: its "ready" has no reader
    worker.conn.close()
    worker.jobs.close()
    worker.process.wait(timeout=60)
    assert "Traceback" not in capfd.readouterr().err


def test_a_job_the_worker_cannot_unpickle_is_that_jobs_error_without_a_traceback(capfd, monkeypatch):
    import sys

    def absent(x):
        return x

    absent.__module__, absent.__qualname__ = "__main__", "kljax_test_absent"
    monkeypatch.setattr(sys.modules["__main__"], "kljax_test_absent", absent, raising=False)
    with VerifierPool(num_workers=1, timeout_s=30, preload=()) as pool:
        (outcome,) = pool.map(absent, [(1,)])  # pickled by reference to a __main__ the worker does not have
        assert not outcome.ok and "Traceback" not in capfd.readouterr().err
        assert pool.map(abs, [(-1,)])[0].value == 1


@pytest.mark.parametrize("field, message", [
    ("weights='abc'", r"reward\.weights='abc' is a str; expected a list or None"),
    ("timeout_s=-1.0", r"reward\.timeout_s=-1\.0 must be a number of seconds > 0"),
    ("on_error='ignore'", r"reward\.on_error='ignore' is not valid; choose one of \['raise', 'skip'\]"),
])
def test_reward_settings_are_validated_without_any_function(field, message):
    with pytest.raises(UserError, match=message):
        load_run_config("configs/tiny.py", [f"--config.reward.{field}"])


def test_a_function_of_main_runs_in_the_pool(tmp_path):
    """A script's (or notebook's) own function with reward.timeout_s: sent by value (cloudpickle)."""
    pytest.importorskip("cloudpickle")
    namespace = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        def scripted(completions, **kwargs):
            return [float(len(c)) for c in completions]
    """), namespace)  # noqa: S102 - the test's own code, defined as a script's __main__ would
    rs = reward_set(namespace["scripted"], timeout_s=30.0)
    try:
        assert rs(examples(), ["1", "22", "333"]).parts["scripted"].tolist() == [1.0, 2.0, 3.0]
    finally:
        rs.close()


def test_a_main_spec_runs_with_the_time_limit(monkeypatch):
    """reward.functions='__main__:fn' (a script calling kljax.train): it broke with reward.timeout_s."""
    import sys

    def main_fn(completions, **kwargs):
        return [3.0] * len(completions)

    main_fn.__module__, main_fn.__qualname__ = "__main__", "kljax_test_main_fn"
    monkeypatch.setattr(sys.modules["__main__"], "kljax_test_main_fn", main_fn, raising=False)
    c = load_run_config(("configs/tiny.py"), ["--config.reward.functions=__main__:kljax_test_main_fn",
                                                          "--config.reward.timeout_s=30.0"])
    rs = RewardSet.from_config(c, get_task("repeat_digit"), columns=["answer"])
    try:
        assert rs(examples(2), ["1", "2"]).parts["kljax_test_main_fn"].tolist() == [3.0, 3.0]
    finally:
        rs.close()
