"""Bad values, files and sizes of the second hostile pass (#41 items 5-6): each refused in one line
`kljax CMD: error: ...` naming the field or file (and the valid range), exit 2, no traceback, before
anything compiles; sizes that cannot fit the machine refused with the estimate and the limit before
they are allocated. Commands run in-process through `kljax.cli.main`.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import jax
import pytest
from error_lines import the_error_line

from kljax.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--config", "configs/tiny.py", "--no-progress"]


class Compiles:
    """Counts JAX compilations (tracing or backend) while the test runs."""

    def __init__(self) -> None:
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, *_: object, **__: object) -> None:
        if name.startswith("/jax/core/compile/"):
            self.count += 1


COMPILES = Compiles()


def fails_cleanly(argv: list[str], expected: list[str], capsys, may_compile: bool = False) -> str:
    """main(argv) exits 2 with one `kljax CMD: error:` line holding every `expected` text, no
    traceback and (unless may_compile) without compiling. Returns the line."""
    before = COMPILES.count
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, out[-1000:], err[-3000:])
    assert "Traceback" not in out + err, err[-3000:]
    line = the_error_line(err, argv[0])
    for text in expected:
        assert text in line, (text, line)
    if not may_compile:
        assert COMPILES.count == before, f"{argv}: compiled before failing"
    return line


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults")
    p = {"root": root}
    (root / "a_dir").mkdir()
    p["a_dir"] = root / "a_dir"
    os.mkfifo(root / "a_fifo")
    p["a_fifo"] = root / "a_fifo"
    p["latin1"] = root / "latin1.jsonl"
    p["latin1"].write_bytes(b'{"prompt": "12", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    p["ragged"] = root / "ragged.csv"
    p["ragged"].write_text("prompt,answer\n12,1\n34,2,extra\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    p["empty_parquet"] = root / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}),
                   p["empty_parquet"])
    depth = 100_000
    p["deep_json"] = root / "deep.json"
    p["deep_json"].write_text('{"a": ' + "[" * depth + "]" * depth + "}")
    p["deep_yaml"] = root / "deep.yaml"
    p["deep_yaml"].write_text("a: " + "[" * depth + "]" * depth + "\n")
    p["latin1_yaml"] = root / "latin1.yaml"
    p["latin1_yaml"].write_bytes(b"beta: 0.04\nloss_type: caf\xe9\n")
    p["list_variants"] = root / "sweep_list.py"
    p["list_variants"].write_text(
        "import ml_collections\n\n\ndef get_config():\n    return ml_collections.ConfigDict(dict(\n"
        f"        base_config={str(ROOT / 'configs' / 'tiny.py')!r}, kl=['k1-reward'], beta=[0.05],\n"
        "        variants=['onpolicy', 'async']))\n")
    return p


TRAIN_CASES = [  # (id, extra argv, texts the line must hold)
    ("tiny-hidden-negative", ["--config.model.tiny.hidden_size=-32"], ["config.model.tiny.hidden_size=-32", ">= 1"]),
    ("tiny-layers-zero", ["--config.model.tiny.num_layers=0"], ["config.model.tiny.num_layers=0", ">= 1"]),
    ("tiny-heads-zero", ["--config.model.tiny.num_heads=0"], ["config.model.tiny.num_heads=0", ">= 1"]),
    ("steps-negative", ["--config.steps=-1"], ["config.steps=-1", ">= 1"]),
    ("stop-after-zero", ["--stop-after", "0"], ["--stop-after=0", ">= 1"]),
    ("stop-after-negative", ["--stop-after", "-1"], ["--stop-after=-1", ">= 1"]),
    ("log-samples-n-negative", ["--config.log_samples_n=-3"], ["config.log_samples_n=-3", ">= 1"]),
    ("eval-splits-commas", ["--config.task.eval_splits=,,,"], ["config.task.eval_splits=',,,'"]),
    ("eval-splits-empty-name", ["--config.task.eval_splits=test,,test"], ["config.task.eval_splits='test,,test'"]),
]


@pytest.mark.parametrize("case", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_value_refused_with_field_and_range(files, capsys, case):
    _, extra, expected = case
    workdir = files["root"] / f"never_{case[0]}"
    line = fails_cleanly(["train", *TINY, "--workdir", str(workdir), *extra], expected, capsys)
    assert "optim.total_steps" not in line  # steps=-1 is `steps`, not the schedule's derived field
    assert not workdir.exists()  # refused before the workdir was made


DATA_CASES = [  # (id, task name, file key, texts the line must hold)
    ("directory", "jsonl", "a_dir", ["is a directory"]),
    ("fifo", "jsonl", "a_fifo", ["named pipe (FIFO)"]),
    ("dev-zero", "jsonl", "/dev/zero", ["/dev/zero", "character device"]),
    ("non-utf8", "jsonl", "latin1", ["is not UTF-8", "byte 0xe9 at line 2"]),
    ("ragged-csv", "csv", "ragged", ["line 3 has 3 field(s)", "header has 2"]),
    ("zero-row-parquet", "parquet", "empty_parquet", ["has no rows"]),
]


@pytest.mark.parametrize("case", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_data_file_named_for_what_it_is(files, capsys, case):
    _, name, key, expected = case
    path = key if key.startswith("/") else str(files[key])
    # A FIFO read would block until a writer comes: one comes after 25 s, so a reader that blocked
    # fails the 30 s bound instead of hanging the suite.
    unblock = threading.Timer(25, lambda: open(path, "w").close()) if key == "a_fifo" else None
    if unblock:
        unblock.start()
    try:
        line = fails_cleanly(["train", *TINY, "--workdir", str(files["root"] / "never_data"),
                              f"--config.task.name={name}", f"--config.task.path={path}"], [path, *expected], capsys)
    finally:
        if unblock:
            unblock.cancel()
    assert "does not exist" not in line


OTHER_CASES = [  # (id, argv with {file keys}, texts the line must hold)
    ("audit-beta-overflow", ["audit", "trl-grpo", "beta=1e999"], ["beta=inf", "not a finite number"]),
    ("audit-deep-json", ["audit", "trl-grpo", "--file", "{deep_json}"], ["{deep_json}", "nests too deeply"]),
    ("audit-deep-yaml", ["audit", "trl-grpo", "--file", "{deep_yaml}"], ["{deep_yaml}", "nests too deeply"]),
    ("audit-non-utf8", ["audit", "trl-grpo", "--file", "{latin1_yaml}"],
     ["{latin1_yaml}", "is not UTF-8", "line 2"]),
    ("bias-run-config", ["bias-study", "--config", "configs/tiny.py", "--no-progress"],
     ["configs/tiny.py is not a bias-study config", "policy", "configs/bias_default.py"]),
    ("convert-negative-tolerance", ["convert", "--check", "--tolerance", "-1"], ["--tolerance=-1", ">= 0"]),
    ("sweep-list-variants", ["sweep", "--config", "{list_variants}", "--out", "{root}/sweep_out"],
     ["variants=['onpolicy', 'async']", "map each variant name"]),
]


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_other_command_refuses_in_one_line(files, capsys, case):
    _, argv, expected = case
    names = {k: str(v) for k, v in files.items()}
    fails_cleanly([a.format(**names) for a in argv], [e.format(**names) for e in expected], capsys)


def test_plot_run_out_directory_gets_the_png_inside(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 3}) + "\n" for s in (1, 2, 3)))
    out_dir = tmp_path / "figures"
    out_dir.mkdir()
    assert main(["plot-run", str(run), "--out", str(out_dir)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == str(out_dir / "curves.png")
    assert (out_dir / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert not Path(str(out_dir) + ".png").exists()
    # a path without a suffix gets .png and the printed path is the file written
    assert main(["plot-run", str(run), "--out", str(tmp_path / "named")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "named.png")
    assert (tmp_path / "named.png").is_file()
    fails_cleanly(["plot-run", str(run), "--out", str(tmp_path / "x.jpg")], ["x.jpg", "PNG"], capsys)


SIZE_CASES = [  # sizes that cannot fit any machine kljax runs on: refused before allocation, with numbers
    ("hidden-size-1e7", ["train", *TINY, "--workdir", "{root}/never_size", "--config.model.tiny.hidden_size=10000000"],
     ["this run needs at least", "GiB", "is available", "weights", "optimizer"]),
    ("group-size-1e8", ["train", *TINY, "--workdir", "{root}/never_size", "--config.rl.group_size=100000000"],
     ["this run needs at least", "KV cache", "is available"]),
    ("eval-n-examples-1e8", ["eval", "--model", "tiny", "--tasks", "repeat_digit:test", "--n-examples", "1e8",
                             "--no-progress"], ["evaluating 100000000 examples", "needs at least", "is available"]),
]


@pytest.mark.parametrize("case", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_size_refused_before_allocation(files, capsys, case):
    _, argv, expected = case
    names = {k: str(v) for k, v in files.items()}
    line = fails_cleanly([a.format(**names) for a in argv], expected, capsys)
    assert "MemAvailable" in line or "cgroup" in line or "device" in line  # where the limit came from


def test_memory_estimate_against_a_given_limit():
    """The estimate of hidden_size=1e6 (the hostile pass's run killed at 9.5 GB) exceeds a 9.5 GiB
    machine, names both numbers; configs/tiny.py fits in 1 GiB."""
    import dataclasses

    from kljax.config import load_run_config
    from kljax.errors import UserError
    from kljax.models.config import num_params
    from kljax.train.memory_check import check_train_fits, train_estimate
    from kljax.train.policy import tiny_model_config

    config = load_run_config(ROOT / "configs" / "tiny.py")
    settings = config
    small = tiny_model_config(config.model, 19)
    check_train_fits(small, settings.rl, limit=(2**30, "1 GiB given"))
    big_section = dataclasses.replace(config.model, tiny=dataclasses.replace(config.model.tiny, hidden_size=1_000_000))
    big = tiny_model_config(big_section, 19)
    estimate = train_estimate(big, settings.rl)
    assert estimate.parts["weights"] == 2 * 4 * num_params(big)  # trained copy + reference, float32
    assert estimate.parts["optimizer"] == 3 * 4 * num_params(big)  # two Adam moments + the gradient
    expected = r"needs at least 13\.9 GiB \(weights .* but 9\.5 GiB is available \(9.5 GiB given\)"
    with pytest.raises(UserError, match=expected):
        check_train_fits(big, settings.rl, limit=(int(9.5 * 2**30), "9.5 GiB given"))


def test_bad_data_fails_before_any_compile(tmp_path, capsys):
    """A prompt longer than the rl.max_prompt_len the user chose is found in the user's data before the
    model's first compile (the data checks run before the weights are made). Left unset, it is fitted
    to the data instead (tests/test_api.py)."""
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": "1234567890" * 3, "answer": "1"}) + "\n" for _ in range(10)))
    fails_cleanly(["train", *TINY, "--workdir", str(tmp_path / "run"), "--config.task.name=jsonl",
                   f"--config.task.path={data}", "--config.task.eval_splits=", "--config.task.eval_fraction=0.0",
                   "--config.rl.max_prompt_len=4"],
                  [str(data), "max_prompt_len"], capsys)


def test_bad_reward_fails_before_any_compile(tmp_path, capsys):
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text("def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    fails_cleanly(["train", *TINY, "--workdir", str(tmp_path / "run"),
                   f"--config.reward.functions={rewards}:no_such_function"], ["no_such_function"], capsys)
