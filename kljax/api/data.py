"""The datasets handed to `RLTrainer`: a path read where it is, or a Python object (a datasets
Dataset / DatasetDict, a list of dicts) checked in the constructor and saved under WORKDIR/data when
training starts (a resumed run reads the copy it started with)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kljax.errors import UserError
from kljax.util.owned_paths import is_marked, mark, remove_marked

DATA_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}


def path_kind(path: Path) -> str:
    """task.name for a data path: "hf" for a directory, else by the file's suffix."""
    if path.is_dir():
        return "hf"
    kind = DATA_SUFFIXES.get(path.suffix.lower())
    if kind is None or not path.is_file():
        what = "does not exist" if not path.exists() else f"is not a {', '.join(DATA_SUFFIXES)} file nor a directory"
        raise UserError(f"RLTrainer: dataset path {str(path)!r} {what}")
    return kind


@dataclasses.dataclass
class DataSource:
    """paths: (train, eval) given as paths, read where they are; dataset: the object to save instead."""

    paths: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    dataset: Any = None

    def fields(self, workdir: Path) -> dict[str, Any]:
        """The task fields that point the run at this data."""
        if self.dataset is not None:
            return {"task.name": "hf", "task.path": str(workdir / "data")}
        if len(self.paths) == 1:
            return {"task.name": self.kinds[0], "task.path": self.paths[0]}
        return {"task.name": self.kinds[0], "task.path": f"train={self.paths[0]},test={self.paths[1]}"}

    def rows(self) -> int:
        """The training rows (the whole train split given; a path is read to count them)."""
        import datasets

        data = self.dataset if self.dataset is not None else _as_dataset(self.paths[0], None)
        return len(data["train"] if isinstance(data, datasets.DatasetDict) else data)

    def record(self, workdir: Path, resuming: bool) -> None:
        """Save the dataset object as WORKDIR/data: kept as it is when the run resumes, replaced only when
        an earlier attempt of this run wrote it (marked), never over a directory kljax did not write."""
        target = workdir / "data"
        if self.dataset is None or (resuming and target.is_dir()):
            return
        if target.exists() or target.is_symlink():
            if not is_marked(target):
                raise UserError(f"RLTrainer: {target} exists and kljax did not write it; it is not replaced (give "
                                "another workdir, or pass that directory itself as train_dataset)")
        workdir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".data-", dir=workdir))
        self.dataset.save_to_disk(str(staging / "data"))
        mark(staging / "data", "RLTrainer's copy of the training data")
        if target.exists():
            remove_marked(target, "RLTrainer's earlier data copy")
        (staging / "data").rename(target)
        staging.rmdir()


def data_source(train: Any, eval_: Any) -> DataSource | None:
    if train is None:
        if eval_ is not None:
            raise UserError("RLTrainer: eval_dataset needs a train_dataset")
        return None
    paths = [d for d in (train, eval_) if isinstance(d, (str, os.PathLike))]
    if len(paths) == (1 if eval_ is None else 2):
        kinds = tuple(path_kind(Path(p)) for p in paths)
        if eval_ is None or kinds[0] == kinds[1] != "hf":
            return DataSource(tuple(str(p) for p in paths), kinds)
    return DataSource(dataset=_as_dataset(train, eval_))


def _as_dataset(train: Any, eval_: Any) -> Any:
    """A datasets.Dataset (no split: task.eval_fraction holds rows out) or a DatasetDict with train (+ test)."""
    import datasets

    def one(data: Any, what: str) -> Any:
        if isinstance(data, (str, os.PathLike)):
            kind = path_kind(Path(data))
            if kind == "hf":
                loaded = datasets.load_from_disk(str(data))
                return loaded["train"] if isinstance(loaded, datasets.DatasetDict) else loaded
            return datasets.load_dataset({"jsonl": "json"}.get(kind, kind), data_files=str(data), split="train")
        if isinstance(data, datasets.Dataset):
            if len(data) == 0:
                raise UserError(f"RLTrainer: {what} is an empty datasets.Dataset; it needs rows to train on")
            return data
        if isinstance(data, Sequence) and not isinstance(data, (str, bytes)) and data and all(
                isinstance(r, Mapping) for r in data):
            try:
                return datasets.Dataset.from_list([dict(r) for r in data])
            except Exception as e:  # noqa: BLE001 - pyarrow's many type errors
                raise UserError(f"RLTrainer: {what} rows cannot form one table: {type(e).__name__}: {e}") from None
        raise UserError(f"RLTrainer: {what} is a {type(data).__name__}; give a datasets.Dataset or DatasetDict, a "
                        "path (file or directory), or a non-empty list of dicts")

    if isinstance(train, datasets.DatasetDict):
        if "train" not in train:
            raise UserError(f"RLTrainer: train_dataset has no 'train' split; splits: {sorted(train)}")
        if len(train["train"]) == 0:
            raise UserError("RLTrainer: train_dataset's 'train' split is empty; it needs rows to train on")
        if eval_ is None:
            return train
        return datasets.DatasetDict({"train": train["train"], "test": one(eval_, "eval_dataset")})
    train = one(train, "train_dataset")
    if eval_ is None:
        return train
    return datasets.DatasetDict({"train": train, "test": one(eval_, "eval_dataset")})
