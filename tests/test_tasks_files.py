"""Tasks from the user's files (jsonl, csv, parquet, hf directories): rows, splits, prompts, epochs,
and every row checked before training (missing keys, overlong prompts)."""

from __future__ import annotations

import json

import pytest

from kljax.config import load_run_config, with_overrides
from kljax.models.tokenizers import CharTokenizer
from kljax.tasks.files import FileTask, parse_path
from kljax.tasks.from_config import check_prompts, task_of
from kljax.tasks.prompting import ANSWER_FORMATS, SYSTEM_PROMPT
from kljax.train.rollout import prompt_texts


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"question": f"{a}+{a}=", "answer": str(2 * a), "level": a % 3} for a in range(20)]


def config(**task):
    c = load_run_config("configs/tiny.py")
    return with_overrides(c, [f"--config.task.{k}={v}" for k, v in task.items()])


class ChatTokenizer:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text, add_special_tokens=False):
        return list(text)


def test_one_file_is_split_by_eval_fraction_and_columns_travel(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    task = FileTask("jsonl", str(path), prompt_key="question", answer_key="answer", eval_fraction=0.25)
    train, test = task.examples("train"), task.examples("test")
    assert (len(train), len(test)) == (15, 5) and task.splits == ("train", "test")
    assert {e.prompt for e in train}.isdisjoint({e.prompt for e in test})
    ex = train[0]
    assert ex.metadata["columns"]["level"] == int(ex.prompt[0]) % 3 and ex.metadata["columns"]["answer"] == ex.answer
    assert "question" not in ex.metadata["columns"]
    # the same seed makes the same split; eval_fraction 0 keeps every row in train
    again = FileTask("jsonl", str(path), prompt_key="question", answer_key="answer", eval_fraction=0.25)
    assert [e.id for e in again.examples("test")] == [e.id for e in test]
    assert FileTask("jsonl", str(path), prompt_key="question", eval_fraction=0).splits == ("train",)


@pytest.mark.parametrize("fmt", ["csv", "parquet", "hf"])
def test_train_and_test_files_in_other_formats(tmp_path, fmt):
    import datasets

    train_ds, test_ds = datasets.Dataset.from_list(ROWS[:12]), datasets.Dataset.from_list(ROWS[12:])
    if fmt == "hf":
        datasets.DatasetDict({"train": train_ds, "test": test_ds}).save_to_disk(str(tmp_path / "ds"))
        path = str(tmp_path / "ds")
    else:
        for name, ds in (("train", train_ds), ("test", test_ds)):
            getattr(ds, f"to_{fmt}")(str(tmp_path / f"{name}.{fmt}"))
        path = f"train={tmp_path / f'train.{fmt}'},test={tmp_path / f'test.{fmt}'}"
    task = FileTask(fmt, path, prompt_template="Q: {question} (level {level})", answer_key="answer")
    assert len(task.examples("train")) == 12 and len(task.examples("test")) == 8
    assert task.examples("test")[0].prompt == "Q: 12+12= (level 0)"


def test_missing_keys_name_the_file_and_row(tmp_path):
    rows = [dict(r) for r in ROWS[:5]]
    del rows[3]["question"]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ValueError, match=r"d\.jsonl, row 4: prompt column 'question' \(task\.prompt_key\).*missing"):
        FileTask("jsonl", str(path), prompt_key="question")
    with pytest.raises(ValueError, match=r"row 1: answer column 'solution'.*\['answer', 'level', 'question'\]"):
        FileTask("jsonl", str(write_jsonl(tmp_path / "e.jsonl", ROWS[:3])), prompt_key="question",
                 answer_key="solution")
    with pytest.raises(ValueError, match=r"row 1: task\.prompt_template=.*names 'nope'"):
        FileTask("jsonl", str(tmp_path / "e.jsonl"), prompt_template="{nope}")
    with pytest.raises(ValueError, match=r"does not exist"):
        FileTask("jsonl", str(tmp_path / "absent.jsonl"))
    with pytest.raises(ValueError, match=r"train=FILE or test=FILE"):
        parse_path("train=a.jsonl,dev=b.jsonl")
    with pytest.raises(ValueError, match=r"unknown data format 'xml'; valid formats"):
        FileTask("xml", "a.xml")
    with pytest.raises(ValueError, match=r"config\.task\.name='nope' is not valid; choose a task .*'jsonl'"):
        task_of(config(name="nope"))


def test_prompts_system_prompt_template_messages_and_answer_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"question": "2+2=", "answer": "4", "messages": [{"role": "user", "content": "hi"}]}])
    tok = ChatTokenizer()
    task = FileTask("jsonl", str(path), prompt_key="question", answer_key="answer", eval_fraction=0)
    ex = task.examples("train")[0]
    # the user's data: no system prompt nor answer-format line unless asked; "auto" sends it as written
    assert prompt_texts([ex], task, tok, "chat") == ["<user>2+2=<assistant>"]
    assert prompt_texts([ex], task, tok, "auto") == ["2+2="]
    task.system_prompt = SYSTEM_PROMPT
    assert prompt_texts([ex], task, tok, "chat") == [f"<system>{SYSTEM_PROMPT}<user>2+2=<assistant>"]
    assert prompt_texts([ex], task, tok, "auto") == [f"<system>{SYSTEM_PROMPT}<user>2+2=<assistant>"]
    task.system_prompt = ""
    task.answer_format = "boxed"
    assert prompt_texts([ex], task, tok, "chat") == [f"<user>2+2=\n\n{ANSWER_FORMATS['boxed']}<assistant>"]
    assert prompt_texts([ex], task, tok, "auto") == [f"2+2=\n\n{ANSWER_FORMATS['boxed']}"]
    assert prompt_texts([ex], task, tok, "raw") == [f"2+2=\n\n{ANSWER_FORMATS['boxed']}"]
    chat = FileTask("jsonl", str(path), messages_key="messages", eval_fraction=0)
    assert prompt_texts(chat.examples("train"), chat, tok, "chat") == ["<user>hi<assistant>"]
    # config.task.system_prompt reaches built-in tasks too; "" leaves the system message out
    builtin = task_of(config(system_prompt="", prompt_format="chat"))
    assert prompt_texts(builtin.examples("test", n=1), builtin, tok, "chat")[0].startswith("<user>")


def test_epochs_visit_every_row_once_in_a_seeded_order(tmp_path):
    task = FileTask("jsonl", str(write_jsonl(tmp_path / "d.jsonl", ROWS[:10])), prompt_key="question",
                    eval_fraction=0)
    first, second = task.epoch_examples("train", 0, 10, seed=0), task.epoch_examples("train", 10, 10, seed=0)
    assert sorted(e.id for e in first) == sorted(e.id for e in second) == sorted(f"train-{i}" for i in range(10))
    assert [e.id for e in first] != [e.id for e in second]  # each pass in its own order
    # reading in pieces from any position gives the same stream
    pieces = [e.id for p in range(0, 20, 3) for e in task.epoch_examples("train", p, min(3, 20 - p), seed=0)]
    assert pieces == [e.id for e in first + second]
    assert [e.id for e in task.epoch_examples("train", 0, 10, seed=1)] != [e.id for e in first]


def test_overlong_prompts_fail_naming_the_row_or_are_dropped(tmp_path):
    rows = [{"prompt": "1+1="}, {"prompt": "12345+6789="}, {"prompt": "2+2="}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    c = config(name="jsonl", path=str(path), eval_fraction=0.0, eval_splits="train")
    task = task_of(c)
    with pytest.raises(ValueError, match=r"d\.jsonl, row 2: the prompt has 11 tokens after templating, more than "
                                         r"rl\.max_prompt_len=4.*task\.drop_overlong=True"):
        check_prompts(task, c.task, c.rl, CharTokenizer())
    c = with_overrides(c, ["--config.task.drop_overlong=True"])
    task = task_of(c)
    assert check_prompts(task, c.task, c.rl, CharTokenizer()) == {"train": 1}
    assert [e.prompt for e in task.examples("train")] == ["1+1=", "2+2="]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "1+x"}])
    c = with_overrides(c, [f"--config.task.path={bad}"])
    with pytest.raises(ValueError, match=r"bad\.jsonl, row 1: the prompt cannot be tokenized"):
        check_prompts(task_of(c), c.task, c.rl, CharTokenizer())


def test_check_uses_the_answer_column(tmp_path):
    task = FileTask("jsonl", str(write_jsonl(tmp_path / "d.jsonl", ROWS[:3])), prompt_key="question",
                    answer_key="answer", eval_fraction=0)
    ex = task.examples("train")[2]  # 2+2= -> 4
    assert task.check(ex, "so \\boxed{4}").correct and not task.check(ex, "\\boxed{5}").correct
    assert not FileTask("jsonl", str(tmp_path / "d.jsonl"), prompt_key="question", eval_fraction=0).check(
        ex, "\\boxed{4}").correct


def test_eval_uses_the_runs_own_task_as_configured(tmp_path):
    from kljax.studies.eval_tasks import splits_for

    splits = splits_for(config(system_prompt=""))
    assert [s.spec for s in splits] == ["repeat_digit:test"] and splits[0].task.system_prompt is None
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    file_run = config(name="jsonl", path=str(path), prompt_key="question", eval_splits="test")
    (split,) = splits_for(file_run)
    assert split.spec == "jsonl:test" and len(split.task.examples("test")) == 2
    assert [s.spec for s in splits_for(file_run, "jsonl,arithmetic:ood_ops")] == ["jsonl:test", "arithmetic:ood_ops"]
    with pytest.raises(ValueError, match=r"'csv:test'.*this run's task is 'jsonl'"):
        splits_for(file_run, "csv:test")
