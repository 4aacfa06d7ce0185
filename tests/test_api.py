"""A TRL-style job runs unchanged through `kljax.RLTrainer` and `kljax train` on the tiny model: a
standard and a conversational dataset saved with `datasets.save_to_disk`, two rewards with TRL's
signatures (one reading completion_ids and trainer_state); the built-in task's prompt settings do
not leak into the user's data, and the evaluation split is the data's own."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import kljax
from kljax.cli import main as cli_main
from kljax.train.metrics import read_jsonl

datasets = pytest.importorskip("datasets")

REWARDS = '''
def correct(completions, solution, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.strip().startswith(s) else 0.0 for t, s in zip(texts, solution)]


def shorter(completions, completion_ids, trainer_state, **kwargs):
    return [None if not ids else -len(ids) / (1 + trainer_state.global_step) for ids in completion_ids]
'''
SEEN: list[dict] = []


def correct(completions, solution, **kwargs):
    SEEN.append({"completions": completions, "prompts": kwargs["prompts"], "solution": solution})
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.strip().startswith(s) else 0.0 for t, s in zip(texts, solution, strict=True)]


def shorter(completions, completion_ids, trainer_state, **kwargs):
    SEEN.append({"ids": completion_ids, "step": trainer_state.global_step})
    return [None if not ids else -len(ids) / (1 + trainer_state.global_step) for ids in completion_ids]


ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(6) for b in range(4)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Directories of the two datasets: standard (one Dataset, no split) and conversational (train + test)."""
    root = tmp_path_factory.mktemp("trl_data")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(root / "standard"))
    conv = [{"prompt": [{"role": "user", "content": r["prompt"]}], "solution": r["solution"]} for r in ROWS]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(conv[:16]),
                          "test": datasets.Dataset.from_list(conv[16:])}).save_to_disk(str(root / "conversational"))
    (root / "rewards.py").write_text(REWARDS)
    return root


CONFIG = {"steps": 2, "checkpoint_every": 2, "eval_examples": 8, "rl": {"max_prompt_len": 8, "max_new_tokens": 4}}


@pytest.mark.parametrize("layout", ["standard", "conversational"])
def test_trl_job_through_the_python_api(saved, tmp_path, layout, capsys):
    SEEN.clear()
    # the standard data as a path, the conversational one as the DatasetDict object (saved under the workdir)
    data = str(saved / layout) if layout == "standard" else datasets.load_from_disk(str(saved / layout))
    trainer = kljax.RLTrainer(model="tiny", reward_funcs=[correct, shorter], reward_weights=[1.0, 0.5],
                              train_dataset=data, config=CONFIG, workdir=tmp_path / "run", progress=False)
    result = trainer.train()
    out = capsys.readouterr()
    assert isinstance(result, kljax.TrainResult) and result.policy.params is not None
    assert [r["step"] for r in result.metrics] == [1, 2]
    for row in result.metrics:
        assert row["reward"] == pytest.approx(row["rewards/correct/mean"] + 0.5 * row["rewards/shorter/mean"], abs=1e-4)
    calls = [c for c in SEEN if "prompts" in c]
    if layout == "conversational":
        assert calls[0]["prompts"][0] == [{"role": "user", "content": calls[0]["prompts"][0][0]["content"]}]
        assert calls[0]["completions"][0][0]["role"] == "assistant"
        assert list(result.eval_after) == ["test"] and result.eval_after["test"]["n"] == 8  # the data's own split
    else:
        assert calls[0]["prompts"][0] in {r["prompt"] for r in ROWS}  # as written: no system prompt, no answer line
        assert isinstance(calls[0]["completions"][0], str)
        assert "holds out 3 of 24 rows" in out.out  # the held-out fraction is printed
        assert list(result.eval_after) == ["test"]
    states = sorted({c["step"] for c in SEEN if "step" in c})
    assert states[:2] == [0, 1] and all(isinstance(i, int) for c in SEEN if "ids" in c for ids in c["ids"] for i in ids)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert [f.rsplit(".", 1)[-1] for f in config["reward"]["functions"]] == ["test_api:correct",
                                                                            "test_api:shorter"]  # module:name
    assert config["task"]["system_prompt"] is None and config["task"]["answer_format"] == ""
    if layout == "standard":
        written = trainer.save_pretrained(tmp_path / "hf")
        assert (written / "config.json").is_file() and (written / "tokenizer.json").is_file()


def test_trl_job_through_the_cli(saved, tmp_path):
    for layout in ("standard", "conversational"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / layout),
                             "--no-progress", "--config.task.name=hf", f"--config.task.path={saved / layout}",
                             f"--config.reward.functions={saved / 'rewards.py'}:correct,{saved / 'rewards.py'}:shorter",
                             "--config.reward.timeout_s=30.0", "--config.steps=1", "--config.eval_examples=8",
                             "--config.rl.max_prompt_len=8", "--config.rl.max_new_tokens=4"])
        assert code == 0, out.getvalue()[-2000:]
        (row,) = read_jsonl(tmp_path / layout / "metrics.jsonl")
        assert "rewards/correct/mean" in row and "rewards/shorter/mean" in row
        assert json.loads((tmp_path / layout / "config.json").read_text())["task"]["eval_splits"] == "test"


def test_data_files_get_no_built_in_task_settings(tmp_path, capsys):
    """configs/tiny.py is written for repeat_digit (raw prompts, its evaluation split "test"): with the
    user's data those settings stay behind, and the reset is said, with what to do to keep one."""
    from kljax.api import run_config

    config, _ = run_config("configs/tiny.py", ["--config.task.name=jsonl", "--config.task.path=d.jsonl"])
    assert config.task.eval_splits == "" and config.task.prompt_format == "auto"
    err = capsys.readouterr().err
    assert "task.prompt_format='raw'" in err and "task.eval_splits='test'" in err and "explicitly" in err
    config, _ = run_config("configs/tiny.py", ["--config.task.name=jsonl", "--config.task.prompt_format=raw"])
    assert config.task.prompt_format == "raw"  # asked for: kept


def test_prompts_as_written_messages_key_prompt_and_the_longest_row_named(tmp_path):
    from kljax.api import run_config
    from kljax.models.tokenizers import CharTokenizer
    from kljax.tasks.from_config import check_prompts, task_of
    from kljax.tasks.prompting import prompt_texts

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:4] + [{"prompt": "12345+678=", "solution": "x"}]))
    config, _ = run_config(None, ["--config.task.name=jsonl", f"--config.task.path={data}",
                                  "--config.task.eval_fraction=0.0", "--config.rl.max_prompt_len=6"])
    task = task_of(config)
    assert prompt_texts(task.examples("train", n=1), task, CharTokenizer(), config.task.prompt_format) == ["0+0="]
    with pytest.raises(ValueError, match=r"d\.jsonl, row 5: the prompt has 10 tokens .*rl\.max_prompt_len=6, the "
                                         r"longest of 1 such rows; set rl\.max_prompt_len=10 \(the model's context "
                                         r"of 64 leaves room for 32"):
        check_prompts(task, config.task, config.rl, CharTokenizer(), context=64)
    # TRL's conversational layout named with kljax's task.messages_key (a KeyError before)
    conv = tmp_path / "c.jsonl"
    conv.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1="}], "solution": "2"}) + "\n")
    config, _ = run_config(None, ["--config.task.name=jsonl", f"--config.task.path={conv}",
                                  "--config.task.messages_key=prompt", "--config.task.eval_fraction=0.0"])
    task = task_of(config)
    assert task.conversational and task.messages(task.examples("train")[0]) == [{"role": "user", "content": "1+1="}]


def test_max_prompt_len_defaults_to_the_longest_prompt(tmp_path):
    from kljax.api import run_config
    from kljax.train.user_data import auto_prompt_len

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:4] + [{"prompt": "12345+678=", "solution": "x"}]))
    run = tmp_path / "run.yaml"  # the run defaults (rl.max_prompt_len=64) with the tiny model
    run.write_text(f"model: {{source: tiny}}\ntask: {{name: jsonl, path: {data}}}\n")
    config, explicit = run_config(str(run))
    assert auto_prompt_len(config, explicit) == 10  # "12345+678=" as written, one token per character
    config, explicit = run_config(str(run), ["--config.rl.max_new_tokens=60"])
    assert auto_prompt_len(config, explicit) == 4  # the tiny model's 64 positions leave 4
    config, explicit = run_config(str(run), ["--config.rl.max_prompt_len=64"])
    assert auto_prompt_len(config, explicit) is None  # chosen: kept


def test_the_tiny_demos_prompt_length_does_not_reach_the_users_data(tmp_path, capsys):
    """RLTrainer(model="tiny") starts from configs/tiny.py, whose rl.max_prompt_len=4 fits its
    repeat_digit prompts: with the user's data it restarts at the run default and is fitted to the
    data (the python_api.md example on the tiny model stopped at 'more than rl.max_prompt_len=4')."""
    from kljax.api import run_config
    from kljax.train.user_data import auto_prompt_len

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:4] + [{"prompt": "12345+678=", "solution": "x"}]))
    task = ["--config.task.name=jsonl", f"--config.task.path={data}"]
    config, explicit = run_config(None, task, model="tiny")
    assert "rl.max_prompt_len=4" in capsys.readouterr().err
    assert auto_prompt_len(config, explicit) == 10
    config, explicit = run_config(None, [*task, "--config.rl.max_prompt_len=4"], model="tiny")
    assert config.rl.max_prompt_len == 4 and auto_prompt_len(config, explicit) is None  # chosen: kept
