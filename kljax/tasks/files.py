"""Tasks from the user's own data: JSONL, Parquet or CSV files, or a `datasets` dataset, read with `datasets`.

    FileTask("jsonl", path="train.jsonl", prompt_key="question", answer_key="answer")
    FileTask("csv", path="train=train.csv,test=test.csv", prompt_template="Solve: {question}")
    FileTask("hf", path="DIR_OR_HUB_NAME", messages_key="messages")

`path` is one file (its rows are split into `train` and `test` by a seeded shuffle, a fraction
`eval_fraction` of them test; 0 keeps them all in train) or `train=FILE,test=FILE`. For `hf` it is a
local dataset directory (`save_to_disk` or a directory of data files) or a hub name, whose
`train`/`test` splits are used.

Each row becomes an `Example`: `prompt` is `prompt_template.format(**row)` (or the row's
`prompt_key` column), `answer` the `answer_key` column as text ("" without one), and
`metadata["columns"]` every column of the row except the prompt column (they go to reward
functions as keyword arguments). With `messages_key`, that column (a list of {"role", "content"})
is the conversation, used as is. Every row is checked when the task is built: the keys must be
present (a ValueError names the file and the 1-based row).

Epochs: `epoch_examples(split, position, n, seed)` reads `n` rows from a stream that visits every
row once per pass, each pass in its own seeded order; the trainer keeps `position` in its
checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kljax.tasks import answers
from kljax.tasks.base import WRONG, Example, Score, Task

FORMATS = {"jsonl": "json", "parquet": "parquet", "csv": "csv", "hf": None}
Message = dict[str, str]


def parse_path(path: str) -> dict[str, str]:
    """"FILE" -> {"all": FILE}; "train=A,test=B" -> {"train": A, "test": B} (ValueError on other keys)."""
    path = str(path).strip()
    if not path:
        raise ValueError("task.path is empty: give a data file, or train=FILE,test=FILE")
    if "=" not in path:
        return {"all": path}
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in path.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in ("train", "test") or not value.strip():
            raise ValueError(f"task.path={path!r}: each part must be train=FILE or test=FILE")
        out[key.strip()] = value.strip()
    if "train" not in out:
        raise ValueError(f"task.path={path!r} names no train file")
    return out


def _read_split_files(fmt: str, files: dict[str, str]) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """{split or "all": (where, rows)} read with `datasets` (files checked to exist first)."""
    import datasets
    from datasets import load_dataset

    datasets.disable_progress_bars()
    out = {}
    for split, file in files.items():
        if not Path(file).is_file():
            raise ValueError(f"task.path: data file {file!r} does not exist")
        try:
            ds = load_dataset(FORMATS[fmt], data_files=str(file), split="train")
        except Exception as e:  # noqa: BLE001 - datasets raises many types for a malformed file
            raise ValueError(f"{file}: could not be read as {fmt}: {type(e).__name__}: {e}") from None
        out[split] = (str(file), ds.to_list())
    return out


def _read_hf(path: str) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """{split: (where, rows)} of a saved dataset directory, a directory of data files, or a hub name."""
    import datasets

    datasets.disable_progress_bars()
    p = Path(path)
    if p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file()):
        loaded = datasets.load_from_disk(str(p))
    else:
        try:
            loaded = datasets.load_dataset(path)
        except Exception as e:  # noqa: BLE001 - offline, missing, malformed: all say the same to the user
            raise ValueError(f"task.path={path!r}: could not load the dataset: {type(e).__name__}: {e}") from None
    if isinstance(loaded, datasets.Dataset):
        return {"all": (path, loaded.to_list())}
    if "train" not in loaded:
        raise ValueError(f"task.path={path!r}: the dataset has no train split; splits: {sorted(loaded)}")
    return {s: (f"{path} [{s}]", loaded[s].to_list()) for s in ("train", "test") if s in loaded}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a split and where it came from (`where`: the file, `index`: its 0-based row)."""

    where: str
    index: int
    values: dict[str, Any]


class FileTask(Task):
    """A task whose examples are the rows of the user's files (see the module docstring).

    Its `check` compares the completion's final answer (`answers.extract_final_answer`) with the
    answer column: integers numerically, anything else as text after `answers.clean_answer`.
    Without an answer column it cannot score: use reward functions or a reward model.
    """

    answer_format = ""  # no answer-format line unless asked (task.answer_format)

    def __init__(self, fmt: str, path: str, prompt_key: str = "prompt", answer_key: str = "",
                 messages_key: str = "", eval_fraction: float = 0.1, prompt_template: str = "",
                 system_prompt: str | None = None, seed: int = 0):
        if fmt not in FORMATS:
            raise ValueError(f"unknown data format {fmt!r}; valid formats: {sorted(FORMATS)}")
        if not 0 <= eval_fraction < 1:
            raise ValueError(f"task.eval_fraction={eval_fraction} must be in [0, 1)")
        self.name = fmt
        self.path, self.prompt_key, self.answer_key = str(path), prompt_key, answer_key
        self.messages_key, self.prompt_template, self.system_prompt = messages_key, prompt_template, system_prompt
        raw = _read_hf(path) if fmt == "hf" else _read_split_files(fmt, parse_path(path))
        rows: dict[str, list[Row]] = {}
        for split, (where, values) in raw.items():
            if not values:
                raise ValueError(f"{where}: no rows")
            rows[split] = [self._checked(Row(where, i, dict(v))) for i, v in enumerate(values)]
        if "all" in rows:
            everything = rows.pop("all")
            order = list(range(len(everything)))
            random.Random(f"kljax-files/{seed}").shuffle(order)
            n_test = math.ceil(eval_fraction * len(everything)) if eval_fraction > 0 else 0
            if n_test >= len(everything):
                raise ValueError(f"task.eval_fraction={eval_fraction} leaves no train rows of {len(everything)}")
            test_idx = set(order[:n_test])
            rows["train"] = [r for r in everything if r.index not in test_idx]
            if n_test:
                rows["test"] = [r for r in everything if r.index in test_idx]
        self._rows = rows
        self.splits = tuple(s for s in ("train", "test") if s in rows)

    # ------------------------------------------------------------------ rows -> examples

    def _checked(self, row: Row) -> Row:
        where = f"{row.where}, row {row.index + 1}"
        v = row.values
        if self.messages_key:
            msgs = v.get(self.messages_key)
            if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msgs
            ):
                raise ValueError(f"{where}: column {self.messages_key!r} (task.messages_key) must be a non-empty "
                                 f"list of {{'role', 'content'}} messages; columns: {sorted(v)}")
        elif self.prompt_template:
            try:
                text = self.prompt_template.format(**v)
            except (KeyError, IndexError) as e:
                raise ValueError(f"{where}: task.prompt_template={self.prompt_template!r} names {e} which the row "
                                 f"lacks; columns: {sorted(v)}") from None
            if not text.strip():
                raise ValueError(f"{where}: the prompt is empty after task.prompt_template")
        elif not isinstance(v.get(self.prompt_key), str) or not v[self.prompt_key].strip():
            got = "missing" if v.get(self.prompt_key) is None else f"{type(v[self.prompt_key]).__name__} " \
                f"{v[self.prompt_key]!r:.40}"
            raise ValueError(f"{where}: prompt column {self.prompt_key!r} (task.prompt_key) must be a non-empty "
                             f"string, got {got}; columns: {sorted(v)}")
        if self.answer_key and v.get(self.answer_key) is None:
            raise ValueError(f"{where}: answer column {self.answer_key!r} (task.answer_key) is missing; "
                             f"columns: {sorted(v)}")
        return row

    def _example(self, split: str, row: Row) -> Example:
        v = row.values
        if self.messages_key:
            users = [m["content"] for m in v[self.messages_key] if m["role"] == "user"]
            prompt = users[-1] if users else v[self.messages_key][-1]["content"]
        elif self.prompt_template:
            prompt = self.prompt_template.format(**v)
        else:
            prompt = v[self.prompt_key]
        answer = "" if not self.answer_key else str(v[self.answer_key])
        columns = {k: val for k, val in v.items() if k != (self.prompt_key if not self.prompt_template else None)}
        if self.answer_key and "answer" not in columns:
            columns["answer"] = answer
        meta = {"columns": columns, "where": row.where, "row": row.index}
        return Example(prompt, answer, self.name, split, f"{split}-{row.index}", meta)

    def rows(self, split: str) -> list[Row]:
        """The rows of `split`, in file order."""
        self.validate_split(split)
        return self._rows[split]

    def drop(self, split: str, indices: Sequence[int]) -> None:
        """Remove the rows at these positions of `rows(split)`."""
        gone = set(indices)
        self._rows[split] = [r for i, r in enumerate(self._rows[split]) if i not in gone]
        if not self._rows[split]:
            raise ValueError(f"task split {split!r} has no rows left after dropping {len(gone)} overlong ones")

    def examples(self, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
        """The first `n` rows of `split` in file order (all when n is None); `seed` is not used."""
        rows = self.rows(split)
        return [self._example(split, r) for r in (rows if n is None else rows[:n])]

    def epoch_examples(self, split: str, position: int, n: int, seed: int) -> list[Example]:
        """`n` examples from `position` of the epoch stream: pass e visits every row once in the order
        of `random.Random((seed, e))`."""
        rows = self.rows(split)
        out, size = [], len(rows)
        for p in range(position, position + n):
            epoch, i = divmod(p, size)
            out.append(self._example(split, rows[self._order(split, seed, epoch)[i]]))
        return out

    def _order(self, split: str, seed: int, epoch: int) -> list[int]:
        cache = self.__dict__.setdefault("_orders", {})
        key = (split, seed, epoch, len(self._rows[split]))
        if key not in cache:
            order = list(range(len(self._rows[split])))
            random.Random(f"kljax-epoch/{seed}/{epoch}").shuffle(order)
            cache.clear()
            cache[key] = order
        return cache[key]

    # ------------------------------------------------------------------ prompts and the default check

    def messages(self, example: Example) -> list[Message]:
        """The conversation of `example`: its messages column as is, else the system prompt (kljax's
        default when None, none when "") and the user prompt, plus the answer-format line when asked."""
        from kljax.tasks.prompting import ANSWER_FORMATS, SYSTEM_PROMPT

        columns = example.metadata["columns"]
        if self.messages_key:
            return [dict(m) for m in columns[self.messages_key]]
        user = example.prompt.strip()
        if self.answer_format:
            user = f"{user}\n\n{ANSWER_FORMATS[self.answer_format]}"
        system = SYSTEM_PROMPT if self.system_prompt is None else self.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]

    def check(self, example: Example, completion: str) -> Score:
        """1.0 when the final answer equals the answer column (see the class docstring)."""
        if not self.answer_key:
            return WRONG
        return Score(1.0, True) if answer_matches(completion, example.answer) else WRONG


def answer_matches(completion: str, target: str) -> bool:
    """Whether the completion's final answer is `target`: as integers when both are, else as cleaned text."""
    predicted = answers.extract_final_answer(completion)
    if predicted is None:
        return False
    if answers.integers_equal(predicted, target):
        return True
    return answers.clean_answer(predicted).strip() == answers.clean_answer(str(target)).strip()
