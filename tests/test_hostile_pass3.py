"""The third hostile pass (#44): nothing written over, every misuse one named line.

Each case below lost data, printed a traceback, said nothing or hung before: a command or the API
replacing a file it did not create or a file of the run it reads, argument errors deep inside the
API, silent acceptance of values that cannot be meant, and a reward function's stray thread or fork.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kljax
from kljax.cli import main as cli_main
from kljax.errors import UserError
from kljax.train.reward_set import RewardFunctionError, RewardSet

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--config", "configs/tiny.py"]
SMALL = ["--config.steps=1", "--config.eval_examples=4", "--config.checkpoint_every=1", "--config.mesh.fsdp=4",
         "--config.mesh.tensor=2", "--no-progress"]  # the 8 simulated devices of tests/conftest.py
ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(8)]


def one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(f"kljax {command}: error: "), err
    return err


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("hostile") / "run"
    assert cli_main(["train", *TINY, "--workdir", str(workdir), *SMALL]) == 0
    return workdir


# ------------------------------------------------------------------------------------------ data loss


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "eval_after.json"])
def test_eval_json_never_writes_over_the_run_it_reads(run, capsys, name):
    before = snapshot(run)
    assert cli_main(["eval", "--checkpoint", str(run), "--json", str(run / name), "--overwrite"]) == 2
    assert "lies inside the run" in one_line(capsys, "eval")
    assert snapshot(run) == before


def test_eval_json_replaces_only_its_own_file_unless_told(run, tmp_path, capsys):
    mine = tmp_path / "notes.json"
    mine.write_text('{"precious": 1}')
    args = ["eval", "--checkpoint", str(run), "--n-examples", "2", "--k", "1", "--no-progress", "--json", str(mine)]
    assert cli_main(args) == 2
    assert "kljax did not write it; pass --overwrite" in one_line(capsys, "eval")
    assert json.loads(mine.read_text()) == {"precious": 1}
    out = tmp_path / "eval.json"
    assert cli_main([*args[:-1], str(out)]) == 0
    assert json.loads(out.read_text())["written_by"] == "kljax eval"
    assert cli_main([*args[:-1], str(out)]) == 0  # its own earlier output: replaced without being told


def test_plot_run_replaces_only_a_png_it_wrote(run, tmp_path, capsys):
    png = tmp_path / "photo.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nnot kljax's")
    assert cli_main(["plot-run", str(run), "--out", str(png)]) == 2
    assert "pass --overwrite" in one_line(capsys, "plot-run")
    assert png.read_bytes().endswith(b"not kljax's")
    ours = tmp_path / "curves.png"
    assert cli_main(["plot-run", str(run), "--out", str(ours)]) == 0
    assert cli_main(["plot-run", str(run), "--out", str(ours)]) == 0  # kljax's own PNG: replaced
    capsys.readouterr()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from kljax.models.tiny import save_tiny_hf_model

    return save_tiny_hf_model("llama3", tmp_path_factory.mktemp("hf") / "llama")


def test_convert_never_replaces_a_users_files_nor_its_own_input(hf_dir, tmp_path, capsys):
    user = tmp_path / "d"
    user.mkdir()
    (user / "config.json").write_text('{"precious": 1}')
    assert cli_main(["convert", "--model", str(hf_dir), "--out", str(user), "--overwrite"]) == 2
    assert "kljax did not write it" in one_line(capsys, "convert")
    assert (user / "config.json").read_text() == '{"precious": 1}' and not (user / "params").exists()
    before = snapshot(hf_dir)
    assert cli_main(["convert", "--model", str(hf_dir), "--out", str(hf_dir)]) == 2
    assert "is the model it reads" in one_line(capsys, "convert")
    assert snapshot(hf_dir) == before
    out = tmp_path / "converted"
    assert cli_main(["convert", "--model", str(hf_dir), "--out", str(out)]) == 0
    assert cli_main(["convert", "--model", str(hf_dir), "--out", str(out)]) == 2  # an earlier output: told first
    assert "--overwrite" in one_line(capsys, "convert")
    assert cli_main(["convert", "--model", str(hf_dir), "--out", str(out), "--overwrite"]) == 0
    capsys.readouterr()


def test_the_constructor_writes_nothing_and_never_replaces_a_users_data_dir(tmp_path):
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "mine.arrow").write_text("a user's own dataset")
    trainer = kljax.RLTrainer(model="tiny", train_dataset=ROWS, workdir=proj, config={"task.answer_key": "answer"})
    assert snapshot(proj) == {"data/mine.arrow": b"a user's own dataset"}  # nothing written yet
    with pytest.raises(UserError, match="kljax did not write it"):
        trainer.train()
    assert (proj / "data" / "mine.arrow").read_text() == "a user's own dataset"


def test_a_finished_runs_data_copy_is_not_replaced(tmp_path):
    work = tmp_path / "w"
    config = {"steps": 1, "eval_examples": 2, "task.answer_key": "answer", "mesh": {"fsdp": 4, "tensor": 2}}
    kljax.RLTrainer(model="tiny", train_dataset=ROWS, workdir=work, config=config, progress=False).train()
    before = snapshot(work / "data")
    other = [{"prompt": "9+9=", "answer": "18"}] * 8
    again = kljax.RLTrainer(model="tiny", train_dataset=other, workdir=work, config=config, progress=False)
    with pytest.raises(UserError, match="already holds a run"):
        again.train()
    assert snapshot(work / "data") == before


# ------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize("kwargs, words", [
    ({"reward_weights": 0.5}, "reward_weights=0.5 is a float"),
    ({"reward_funcs": 5}, "reward_funcs=5 is a int"),
    ({"reward_weights": ["abc"]}, "reward_weights holds 'abc'"),
    ({"config": 5}, "config=5 is a int"),
    ({"workdir": 5}, "workdir=5 is a int"),
    ({"workdir": ""}, "workdir='' is an empty string"),
    ({"config": {"rl": 5}}, "section 'rl' to 5"),
    ({"overrides": "--config.steps=3"}, "overrides='--config.steps=3' is a str"),
    ({"model": 3.5}, "model=3.5 is a float"),
    ({"resume": "maybe"}, "resume='maybe' is not valid"),
])
def test_every_argument_is_checked_where_it_enters(kwargs, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        kljax.RLTrainer(**{"model": "tiny", **kwargs})


def test_an_empty_dataset_and_data_nothing_can_score_are_named():
    datasets = pytest.importorskip("datasets")
    with pytest.raises(UserError, match="empty datasets.Dataset"):
        kljax.RLTrainer(model="tiny", train_dataset=datasets.Dataset.from_list([]), reward_funcs=[len])
    with pytest.raises(UserError, match="every reward would be 0"):
        kljax.RLTrainer(model="tiny", train_dataset=[{"prompt": "1+1="}] * 4, reward_funcs=[])
    with pytest.raises(UserError, match="every reward would be 0"):
        kljax.RLTrainer(model="tiny", train_dataset=[{"prompt": "1+1="}] * 4)


def test_save_pretrained_checks_its_arguments(run, tmp_path):
    trainer = kljax.RLTrainer(config=str(run / "config.json"), workdir=run, resume=True)
    for kwargs, words in (({"out_dir": 5}, "out_dir=5 must be a directory path"),
                          ({"out_dir": tmp_path / "x", "dtype": "int8"}, "dtype='int8' is not one of"),
                          ({"out_dir": tmp_path / "x", "format": "lora"}, "format='lora'"),
                          ({"out_dir": tmp_path / "x", "step": "last"}, "step='last'")):
        with pytest.raises(UserError, match=words):
            trainer.save_pretrained(**kwargs)


def test_a_reward_raising_a_bare_base_exception_is_named():
    class Odd(BaseException):
        pass

    def odd(completions, **kwargs):
        raise Odd()

    from kljax.tasks import get_task
    from kljax.tasks.base import Example

    rs = RewardSet(get_task("repeat_digit"), [("odd", odd)], [1.0], on_error="skip")
    with pytest.raises(RewardFunctionError, match="'odd' .*raised Odd, which is not an Exception"):
        rs([Example("1", "1", "repeat_digit", "train", "t0", {})], ["1"])


# ------------------------------------------------------------------------------------------ commands


@pytest.mark.parametrize("argv, words", [
    (["train", *TINY, "--workdir", ""], "--workdir '' is empty"),
    (["train", *TINY, "--workdir", "{tmp}/w", "--config.model.lora.rank=100000"], "exceeds the q projection"),
    (["train", *TINY, "--workdir", "{tmp}/w", "--config.logging.report_to=mlflow"], "MLFLOW_TRACKING_URI"),
    (["plan", *TINY, "--model", "known:nosuch", "--mesh", "fsdp=3"], "known:nosuch"),
    (["generate", "--model", "default", "--prompt", "hi", "--max-new-tokens", "100000000"], "leaves no room"),
    (["bench", "decode", "--garbage"], "unrecognized arguments: --garbage"),
])
def test_each_misuse_is_one_line_naming_it(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = [a.format(tmp=tmp_path) for a in argv]
    try:
        code = cli_main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert "Traceback" not in err and not (tmp_path / "w").exists()
    assert err.strip().splitlines()[-1].startswith(f"kljax {argv[0]}"), err


def test_export_out_empty_is_named(run, capsys):
    assert cli_main(["export", str(run), "--out", ""]) == 2
    assert "--out '' is empty" in one_line(capsys, "export")


def test_resume_without_config_uses_the_runs_recorded_config(run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert cli_main(["train", "--workdir", str(copy), "--resume", "--config.steps=2", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    capsys.readouterr()


def test_a_resume_after_metrics_were_emptied_says_which_rows_are_lost(run, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "metrics.jsonl").write_text("")
    assert cli_main(["train", "--workdir", str(copy), "--resume", "--config.steps=2", "--no-progress"]) == 0
    assert "lacks the rows of step(s) 1" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ stray work


def _run_with_reward(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "r.py").write_text(body)
    args = [sys.executable, "-m", "kljax", "train", *TINY, "--workdir", str(tmp_path / "run"), *SMALL,
            f"--config.reward.functions={tmp_path / 'r.py'}:f"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KLJAX_HUGEPAGES": "0"})


def test_a_rewards_stray_thread_does_not_keep_the_process_alive(tmp_path):
    done = _run_with_reward(tmp_path, "import threading, time\n"
                                      "def f(completions, **kw):\n"
                                      "    threading.Thread(target=time.sleep, args=(3600,)).start()\n"
                                      "    return [0.0] * len(completions)\n")
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_rewards_fork_does_not_run_the_loop_twice(tmp_path):
    done = _run_with_reward(tmp_path, "import os\n"
                                      "def f(completions, **kw):\n"
                                      "    os.fork()\n"
                                      "    return [0.0] * len(completions)\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("outputs in") == 1, done.stdout[-2000:]
    assert done.stdout.count('"workdir"') == 1
