"""Tasks over loaded data sets: MATH, MATH500, GSM8K and MMLU subjects (see `loaders` for the files).

  math              train: MATH train (7,500 rows, 7,498 examples: two rows have an empty answer and
                    are left out); test: MATH500 (500). Reward: math-verify (worker pool).
  math500           test: MATH500 (500). Reward: math-verify (worker pool).
  gsm8k             train (7,473), test (1,319). Reward: exact integer match.
  mmlu              test: one MMLU STEM subject (`subject=`, e.g. "college_physics": 102,
                    "college_chemistry": 100, "college_biology": 144). Reward: the chosen letter.

`examples(split)` returns every row in file order; `examples(split, n, seed)` a seeded random sample
of n distinct rows. Rows are read once per task object and cached (the cache is not pickled, so tasks
travel cheaply to reward workers).
"""

from __future__ import annotations

import os
import string
from typing import Any

from kljax.tasks import answers, loaders, rewards
from kljax.tasks.base import Example, Score, Task, seeded_rng


class LoadedTask(Task):
    """A task whose examples are rows of data files (see `loaders`).

    Args:
      data_dir: the data directory (default: $KLJAX_DATA_DIR, else ../shared/data beside the repo).
      hub: load by hub name instead of from files (needs internet).
    """

    sources: dict[str, str] = {}  # split -> loaders.SOURCES key

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, hub: bool = False):
        self.data_dir = data_dir
        self.hub = hub
        self._cache: dict[str, list[Example]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    def _hub_format(self) -> dict[str, str]:
        return {}

    def _convert(self, rows: list[loaders.Row], split: str, where: str) -> list[Example]:
        raise NotImplementedError

    def all_examples(self, split: str) -> list[Example]:
        """Every example of `split`, in file order (read once, then cached)."""
        self.validate_split(split)
        if split not in self._cache:
            source = self.sources[split]
            rows = loaders.load_rows(source, self.data_dir, self.hub, **self._hub_format())
            local = loaders.resolve_data_dir(self.data_dir) / loaders.SOURCES[source].local if not self.hub else None
            where = f"hub source {source}" if local is None else str(local)
            self._cache[split] = self._convert(rows, split, where)
        return self._cache[split]

    def examples(self, split: str, n: int | None = None, seed: int = 0) -> list[Example]:
        """All rows of `split` (n=None), or a seeded random sample of n distinct rows."""
        every = self.all_examples(split)
        if n is None:
            return list(every)
        if not 0 <= n <= len(every):
            raise ValueError(f"task {self.name!r} split {split!r} has {len(every)} examples; asked for {n}")
        picked = seeded_rng(self.name, split, seed).sample(range(len(every)), n)
        return [every[i] for i in picked]


class MathTask(LoadedTask):
    """MATH: competition problems with LaTeX answers, checked by math-verify."""

    name = "math"
    splits = ("train", "test")
    sources = {"train": "math/train", "test": "math500/test"}
    uses_verifier_pool = True

    def _convert(self, rows: list[loaders.Row], split: str, where: str) -> list[Example]:
        out = []
        for i, row in enumerate(rows):
            if not row["answer"].strip():
                continue  # nothing to check against (see loaders._MATH_FIELDS)
            meta = {k: row[k] for k in ("level", "type", "subject", "solution") if row.get(k) is not None}
            uid = row.get("unique_id") or f"{self.name}/{split}/{i}"
            out.append(Example(row["problem"], row["answer"].strip(), self.name, split, uid, meta))
        return out

    def check(self, example: Example, completion: str) -> Score:
        """math-verify equivalence of the final answer (run through `score_batch`: it has a time limit)."""
        return rewards.check_math(completion, example.answer)


class Math500Task(MathTask):
    """MATH500: the 500-problem subset of the MATH test split."""

    name = "math500"
    splits = ("test",)
    sources = {"test": "math500/test"}


class GSM8KTask(LoadedTask):
    """GSM8K: grade-school word problems with integer answers (the number after "####")."""

    name = "gsm8k"
    splits = ("train", "test")
    sources = {"train": "gsm8k/train", "test": "gsm8k/test"}

    def _convert(self, rows: list[loaders.Row], split: str, where: str) -> list[Example]:
        out = []
        for i, row in enumerate(rows):
            solution = row["answer"]
            final = solution.rsplit("####", 1)[1].strip().replace(",", "") if "####" in solution else ""
            if answers.parse_integer(final) is None:
                raise ValueError(f"{where}, row {i + 1}: answer has no integer after '####': {solution[-60:]!r}")
            meta = {"solution": solution}
            out.append(Example(row["question"], final, self.name, split, f"{self.name}/{split}/{i}", meta))
        return out

    def check(self, example: Example, completion: str) -> Score:
        """Exact integer match of the final answer."""
        return rewards.check_integer(completion, example.answer)


class MMLUTask(LoadedTask):
    """One MMLU subject as multiple choice: the prompt lists the choices as A., B., ...

    Args:
      subject: the MMLU subject (the `type` field of mmlu_stem/test.jsonl), e.g. "college_physics".
    """

    splits = ("test",)
    sources = {"test": "mmlu_stem/test"}
    instruction = "Reply with the letter of the correct choice."

    def __init__(self, subject: str, data_dir: str | os.PathLike[str] | None = None, hub: bool = False):
        super().__init__(data_dir, hub)
        if not subject or not subject.replace("_", "").isalnum():
            raise ValueError(f"bad MMLU subject {subject!r} (expected e.g. 'college_physics')")
        self.subject = subject
        self.name = f"mmlu_{subject}"

    def _hub_format(self) -> dict[str, str]:
        return {"subject": self.subject}

    def _convert(self, rows: list[loaders.Row], split: str, where: str) -> list[Example]:
        out = []
        subjects = set()
        for row_no, row in enumerate(rows, start=1):
            subjects.add(row["type"])
            if row["type"] != self.subject:
                continue
            choices = row["choices"]
            if not 2 <= len(choices) <= 26 or not all(isinstance(c, str) for c in choices):
                raise ValueError(f"{where}, row {row_no}: 'choices' should be 2 to 26 strings, got {choices!r:.80}")
            if not 0 <= row["answer"] < len(choices):
                raise ValueError(f"{where}, row {row_no}: 'answer' {row['answer']} is not a choice index")
            letters = string.ascii_uppercase[: len(choices)]
            listing = "\n".join(f"{letter}. {choice}" for letter, choice in zip(letters, choices, strict=True))
            meta = {"choices": list(choices), "subject": self.subject, "answer_index": row["answer"]}
            i = len(out)
            out.append(
                Example(
                    f"{row['question']}\n\n{listing}",
                    letters[row["answer"]],
                    self.name,
                    split,
                    f"{self.name}/{split}/{i}",
                    meta,
                )
            )
        if not out:
            raise ValueError(f"{where}: no rows of MMLU subject {self.subject!r}; subjects there: {sorted(subjects)}")
        return out

    def check(self, example: Example, completion: str) -> Score:
        """1.0 when the completion picks the right letter."""
        return rewards.check_choice(completion, example.answer, example.metadata.get("choices", ()))
