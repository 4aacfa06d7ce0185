"""Loaders: the offline data sets (../shared/data or $KLJAX_DATA_DIR), row counts, and row validation.

Tests that read the real sets skip with a reason when the data directory is missing, except under CI
(env var CI set), where they fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kljax.tasks import DATA_DIR_ENV, DataNotFoundError, get_task, load_rows, loaders, resolve_data_dir


def _data_dir_or_skip() -> Path:
    found = loaders.default_data_dir()
    if found is not None and found.is_dir():
        return found
    where = found if found is not None else loaders.SHARED_DATA_DIR
    reason = (
        f"offline data sets not found: {where} is not a directory (set ${DATA_DIR_ENV}, or see "
        "shared/data/README.md beside the repository)"
    )
    if os.environ.get("CI"):
        pytest.fail(f"under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def data_dir() -> Path:
    return _data_dir_or_skip()


@pytest.mark.parametrize(
    "source, rows",
    [("math/train", 7500), ("math500/test", 500), ("gsm8k/test", 1319), ("gsm8k/train", 7473)],
)
def test_row_counts(data_dir, source, rows):
    assert len(load_rows(source)) == rows


@pytest.mark.parametrize(
    "name, size", [("mmlu_college_physics", 102), ("mmlu_college_chemistry", 100), ("mmlu_college_biology", 144)]
)
def test_mmlu_subjects(data_dir, name, size):
    task = get_task(name)
    examples = task.examples("test")
    assert len(examples) == size
    for ex in examples:
        choices = ex.metadata["choices"]
        assert ex.answer in "ABCD"[: len(choices)]
        assert f"\n\nA. {choices[0]}\nB. {choices[1]}" in ex.prompt
    assert task.check(examples[0], f"\\boxed{{{examples[0].answer}}}").correct
    assert len(get_task("mmlu", subject="abstract_algebra").examples("test")) == 100
    with pytest.raises(ValueError, match="no rows of MMLU subject 'underwater_basket_weaving'"):
        get_task("mmlu", subject="underwater_basket_weaving").examples("test")


def test_math_and_gsm8k_examples(data_dir):
    math = get_task("math")
    train, test = math.examples("train"), math.examples("test")
    assert len(train) == 7498  # two MATH train rows have an empty answer
    assert len(test) == 500 and len({ex.id for ex in test}) == 500
    assert all(ex.answer for ex in train + test)
    math500 = get_task("math500").examples("test")
    assert [(ex.prompt, ex.answer, ex.id) for ex in math500] == [(ex.prompt, ex.answer, ex.id) for ex in test]
    gsm = get_task("gsm8k").examples("test")
    assert len(gsm) == 1319 and gsm[0].answer == "18" and "####" in gsm[0].metadata["solution"]
    assert all(ex.answer.lstrip("-").isdigit() for ex in gsm)


def test_sampling_is_seeded_and_distinct(data_dir):
    task = get_task("gsm8k")
    sample = task.examples("test", n=100, seed=7)
    assert sample == get_task("gsm8k").examples("test", n=100, seed=7)
    assert sample != task.examples("test", n=100, seed=8)
    assert len({ex.id for ex in sample}) == 100
    with pytest.raises(ValueError, match="has 1319 examples"):
        task.examples("test", n=2000)


def test_default_is_shared_data_beside_the_repository(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert loaders.SHARED_DATA_DIR == Path(loaders.__file__).resolve().parents[2].parent / "shared" / "data"
    if loaders.SHARED_DATA_DIR.is_dir():
        assert resolve_data_dir() == loaders.SHARED_DATA_DIR


def test_missing_directory_names_the_path_and_the_env_var(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere"
    monkeypatch.setenv(DATA_DIR_ENV, str(missing))
    with pytest.raises(DataNotFoundError, match=f"{missing}.*{DATA_DIR_ENV}"):
        get_task("gsm8k").examples("test")
    with pytest.raises(DataNotFoundError, match="the data_dir argument"):
        resolve_data_dir(tmp_path / "also_missing")


def test_missing_file_names_the_file(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    with pytest.raises(DataNotFoundError, match=str(tmp_path / "gsm8k" / "test.jsonl")):
        get_task("gsm8k", data_dir=tmp_path).examples("test")


def _write(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_env_var_points_at_a_small_directory(monkeypatch, tmp_path):
    _write(tmp_path / "gsm8k" / "test.jsonl", [{"question": "1+1?", "answer": "1+1=2\n#### 2"}] * 3)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    examples = get_task("gsm8k").examples("test")
    assert [ex.answer for ex in examples] == ["2"] * 3


GOOD_MMLU = {"question": "Q?", "type": "college_physics", "choices": ["a", "b", "c", "d"], "answer": 1}


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({k: v for k, v in GOOD_MMLU.items() if k != "choices"}, "missing field 'choices'"),
        ({**GOOD_MMLU, "question": "  "}, "field 'question' is empty"),
        ({**GOOD_MMLU, "answer": "1"}, "field 'answer' should be int, got str"),
        ({**GOOD_MMLU, "answer": True}, "field 'answer' should be int, got bool"),
        ({**GOOD_MMLU, "choices": "abcd"}, "field 'choices' should be list"),
        ({**GOOD_MMLU, "question": None}, "missing field 'question'"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_rows_name_the_file_and_row(tmp_path, bad_row, message):
    path = _write(tmp_path / "mmlu_stem" / "test.jsonl", [GOOD_MMLU, bad_row, GOOD_MMLU])
    with pytest.raises(ValueError, match=f"{path}, row 2: {message}"):
        load_rows("mmlu_stem/test", data_dir=tmp_path)


def test_bad_values_after_validation_name_the_row(tmp_path):
    _write(tmp_path / "mmlu_stem" / "test.jsonl", [GOOD_MMLU, {**GOOD_MMLU, "answer": 7}])
    with pytest.raises(ValueError, match=r"test.jsonl, row 2: 'answer' 7 is not a choice index"):
        get_task("mmlu_college_physics", data_dir=tmp_path).examples("test")
    _write(
        tmp_path / "gsm8k" / "train.jsonl", [{"question": "q", "answer": "#### 3"}, {"question": "q", "answer": "4"}]
    )
    with pytest.raises(ValueError, match=r"train.jsonl, row 2: answer has no integer after '####'"):
        get_task("gsm8k", data_dir=tmp_path).examples("train")
    _write(tmp_path / "math" / "train.jsonl", [{"problem": "p", "answer": "1"}, {"problem": 5, "answer": "2"}])
    with pytest.raises(ValueError, match=r"train.jsonl, row 2: field 'problem' should be str, got int"):
        load_rows("math/train", data_dir=tmp_path)


def test_unknown_source_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"valid sources: \['gsm8k/test'"):
        load_rows("gsm8k/validation")
