"""Tasks from the user's own data: JSONL, Parquet or CSV files, or a `datasets` dataset, read with `datasets`.

    FileTask("jsonl", path="train.jsonl", prompt_key="question", answer_key="answer")
    FileTask("csv", path="train=train.csv,test=test.csv", prompt_template="Solve: {question}")
    FileTask("hf", path="DIR_OR_HUB_NAME", messages_key="messages")

`path` is one file (its rows are split into `train` and `test` by a seeded shuffle, a fraction
`eval_fraction` of them test, `held_out` says how many; 0 keeps them all in train) or
`train=FILE,test=FILE`. For `hf` it is a local dataset directory (`save_to_disk` or a directory of
data files) or a hub name, whose `train` and `test`/`validation` splits are used.
TRL's two layouts are told apart from the data: "standard" (the `prompt_key` column is text) and
"conversational" (a list of {"role", "content"} messages, or `messages_key` names such a column). Every row
is checked when the task is built: the keys must be present (a ValueError names the file and the 1-based
row). A system prompt or answer-format line is added only when asked (`system_prompt`, `answer_format`).
Epochs: `epoch_examples`, whose `position` the trainer keeps in its checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kljax.tasks import answers, file_checks
from kljax.tasks.base import WRONG, Example, Score, Task
from kljax.tasks.prompting import ANSWER_FORMATS

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
        file_checks.check_readable(file)  # a directory, FIFO or device is named, never read
        if fmt != "parquet":
            file_checks.check_utf8(file)
        try:
            with file_checks.quiet_datasets():  # a malformed file is reported below, in one line
                ds = load_dataset(FORMATS[fmt], data_files=str(file), split="train")
        except Exception as e:  # noqa: BLE001 - datasets raises many types for a malformed file
            file_checks.diagnose(fmt, file)  # names the bad line, row or "no rows" where it can
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
    return {s: (f"{path} [{s}]", loaded[s].to_list()) for s in ("train", *FileTask.EVAL_SPLITS) if s in loaded}


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a split and where it came from (`where`: the file, `index`: its 0-based row)."""

    where: str
    index: int
    values: dict[str, Any]


def is_conversation(value: Any) -> bool:
    """Whether `value` is a chat conversation: a non-empty list of {"role": str, "content": str} (TRL's layout)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


class FileTask(Task):
    """A task whose examples are the rows of the user's files (see the module docstring).

    Its `check` compares the completion's final answer (`answers.extract_final_answer`) with the
    answer column: integers numerically, anything else as text after `answers.clean_answer`.
    Without an answer column it cannot score: use reward functions or a reward model.

    `data` ({split or "all": (where, rows)}) gives the rows directly instead of reading `path`.
    `conversational` is decided from the data: the prompt column (or `messages_key`) holds message
    lists. `held_out` is (rows moved to `test`, rows in all) when one file was split, else None.
    """

    answer_format = ""  # no answer-format line unless asked (task.answer_format)
    EVAL_SPLITS = ("test", "validation", "valid", "eval", "dev")

    def __init__(self, fmt: str, path: str, prompt_key: str = "prompt", answer_key: str = "",
                 messages_key: str = "", eval_fraction: float = 0.1, prompt_template: str = "",
                 system_prompt: str | None = None, seed: int = 0,
                 data: dict[str, tuple[str, list[dict[str, Any]]]] | None = None):
        if fmt not in FORMATS:
            raise ValueError(f"unknown data format {fmt!r}; valid formats: {sorted(FORMATS)}")
        if not 0 <= eval_fraction < 1:
            raise ValueError(f"task.eval_fraction={eval_fraction} must be in [0, 1)")
        self.name = fmt
        self.path, self.prompt_key, self.answer_key = str(path), prompt_key, answer_key
        self.messages_key, self.prompt_template, self.system_prompt = messages_key, prompt_template, system_prompt
        if data is not None:
            raw = data
        else:
            raw = _read_hf(path) if fmt == "hf" else _read_split_files(fmt, parse_path(path))
        first = next(iter(raw.values()), ("", []))
        self.conversation_key = messages_key or (
            prompt_key if not prompt_template and first[1] and is_conversation(first[1][0].get(prompt_key)) else "")
        self.conversational = bool(self.conversation_key)
        rows: dict[str, list[Row]] = {}
        for split, (where, values) in raw.items():
            if not values:
                raise ValueError(f"{where}: no rows")
            rows[split] = [self._checked(Row(where, i, dict(v))) for i, v in enumerate(values)]
        self.held_out: tuple[int, int] | None = None
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
                self.held_out = (n_test, len(everything))
        self._rows = rows
        self.splits = tuple(s for s in ("train", *self.EVAL_SPLITS) if s in rows)
        names = {k for rs in rows.values() for r in rs for k in r.values} - (
            {self.prompt_key} if not prompt_template else set())
        self.column_names = tuple(sorted(names | ({"answer"} if answer_key else set())))

    @property
    def default_eval_splits(self) -> tuple[str, ...]:
        """The data's own evaluation split(s): test, validation, ... (none when all rows train)."""
        return tuple(s for s in self.EVAL_SPLITS if s in self._rows)[:1]

    # ------------------------------------------------------------------ rows -> examples

    def _checked(self, row: Row) -> Row:
        where = f"{row.where}, row {row.index + 1}"
        v = row.values
        if self.conversation_key:
            if not is_conversation(v.get(self.conversation_key)):
                field = "task.messages_key" if self.messages_key else "task.prompt_key; conversational data"
                raise ValueError(f"{where}: column {self.conversation_key!r} ({field}) must be a non-empty "
                                 f"list of {{'role', 'content'}} messages like the first row's, got "
                                 f"{type(v.get(self.conversation_key)).__name__}; columns: {sorted(v)}")
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
                             f"string (or, for conversational data in every row, a list of messages), got {got}; "
                             f"columns: {sorted(v)}")
        if self.answer_key and v.get(self.answer_key) is None:
            raise ValueError(f"{where}: answer column {self.answer_key!r} (task.answer_key) is missing; "
                             f"columns: {sorted(v)}")
        return row

    def _example(self, split: str, row: Row) -> Example:
        """`prompt` is `prompt_template.format(**row)` (or the row's `prompt_key` column; conversational: its
        last user message, for display, the conversation in `metadata["messages"]`), `answer` the `answer_key`
        column as text ("" without one), and `metadata["columns"]` every column of the row except the prompt
        column (they go to reward functions as keyword arguments)."""
        v = row.values
        meta: dict[str, Any] = {"where": row.where, "row": row.index}
        if self.conversation_key:
            messages = v[self.conversation_key]
            users = [m["content"] for m in messages if m["role"] == "user"]
            prompt = users[-1] if users else messages[-1]["content"]  # for display; the model gets `messages`
            meta["messages"] = messages
        elif self.prompt_template:
            prompt = self.prompt_template.format(**v)
        else:
            prompt = v[self.prompt_key]
        answer = "" if not self.answer_key else str(v[self.answer_key])
        columns = {k: val for k, val in v.items() if k != (self.prompt_key if not self.prompt_template else None)}
        if self.answer_key and "answer" not in columns:
            columns["answer"] = answer
        meta["columns"] = columns
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
        """The conversation of `example`: its messages as they are (conversational data), else a system
        message when asked (task.system_prompt; none by default) and the prompt, with the
        answer-format line when asked (task.answer_format)."""
        if self.conversational:
            return [dict(m) for m in example.metadata["messages"]]
        system = self.system_prompt or ""
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": self.as_written(example)}]

    def as_written(self, example: Example) -> str:
        """A standard prompt as the data wrote it (after task.prompt_template), with the answer-format
        line when asked."""

        if self.answer_format:
            return f"{example.prompt.strip()}\n\n{ANSWER_FORMATS[self.answer_format]}"
        return example.prompt

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
