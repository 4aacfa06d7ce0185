"""One tiny `kljax train` run with the options of issue 39 items 4-6, checked from its outputs:
rl.stop ends responses, rl.min_p samples, evaluation during training reports each reward
function's mean, W&B (offline) and MLflow (a file store) receive the metrics rows, two checkpoints
are kept by default, and the end of the run prints where the outputs are and what to run next.
The trackers' failures: unknown names, and a tracker that is not installed, each one line."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from kljax.cli import main
from kljax.errors import UserError
from kljax.train import tracking
from kljax.train.metrics import read_jsonl

REWARDS = textwrap.dedent('''
    def length(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    def has_seven(completions, **kw):
        return [float("7" in c) for c in completions]
''')
STOP = "5"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("wandb", reason="W&B is in the track extra (pip install 'kljax[track]')")
    pytest.importorskip("mlflow", reason="MLflow is in the track extra (pip install 'kljax[track]')")
    root = tmp_path_factory.mktemp("options")
    rewards = root / "rewards.py"
    rewards.write_text(REWARDS)
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": f"file:{root / 'mlruns'}",
           "MLFLOW_ALLOW_FILE_STORE": "true"}
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    work = root / "run"
    argv = ["train", "--config", "configs/tiny.py", "--workdir", str(work), "--no-progress",
            "--config.steps=3", "--config.checkpoint_every=1", "--config.eval_every=1", "--config.eval_examples=8",
            f"--config.rl.stop=['{STOP}']", "--config.rl.min_p=0.05", "--config.log_samples_every=1",
            "--config.log_samples_n=32", f"--config.reward.functions={rewards}:length,{rewards}:has_seven",
            "--config.logging.report_to=tensorboard,wandb,mlflow", "--config.logging.project=kljax-test"]
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    try:
        with redirect_stdout(out):
            code = main(argv)
    finally:
        mp.undo()
    return code, out.getvalue(), work, root


def test_stop_strings_end_every_response(tiny_run):
    code, _, work, _ = tiny_run
    assert code == 0
    samples = [json.loads(line) for line in (work / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 32
    ended = [s["completion"] for s in samples if STOP in s["completion"]]
    assert ended, "no sampled response reached the stop (the tiny model emits every symbol)"
    for s in samples:  # nothing after the stop: it ends the response like EOS
        assert STOP not in s["completion"][:-1], s["completion"]


def test_evaluation_reports_each_reward_functions_mean(tiny_run):
    _, _, work, _ = tiny_run
    rows = read_jsonl(work / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    during = json.loads((work / "eval_step_1.json").read_text())["test"]
    assert set(during["rewards"]) == {"length", "has_seven"}
    for name in ("length", "has_seven"):
        assert rows[0][f"eval/test/rewards/{name}/mean"] == pytest.approx(during["rewards"][name])
    assert 0.0 <= during["rewards"]["has_seven"] <= 1.0 and during["rewards"]["length"] > 0
    after = json.loads((work / "eval_after.json").read_text())["test"]
    assert set(after["rewards"]) == {"length", "has_seven"}


def test_wandb_offline_and_mlflow_file_store_get_the_metrics(tiny_run):
    _, _, work, root = tiny_run
    ids = json.loads((work / "tracking.json").read_text())
    assert set(ids) == {"wandb", "mlflow"}
    assert list((work / "wandb").glob(f"offline-run-*-{ids['wandb']}")), "no offline W&B run under the workdir"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{root / 'mlruns'}")
    run = client.get_run(ids["mlflow"])
    assert run.data.params["rl.min_p"] == "0.05" and run.data.params["steps"] == "3"
    rows = read_jsonl(work / "metrics.jsonl")
    history = {m.step: m.value for m in client.get_metric_history(ids["mlflow"], "reward")}
    assert history == pytest.approx({r["step"]: r["reward"] for r in rows})
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "eval/test/rewards/length/mean")] == [1, 2]
    assert client.get_metric_history(ids["mlflow"], "rewards/length/mean")  # the names W&B and TensorBoard get
    assert list((work / "tb").iterdir())


def test_two_checkpoints_kept_by_default_and_the_end_names_outputs_and_next_commands(tiny_run):
    _, out, work, _ = tiny_run
    assert sorted(p.name for p in (work / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "3"]
    lines = out.strip().splitlines()
    assert json.loads(lines[-1])["workdir"] == str(work)  # the machine-readable summary stays last
    text = "\n".join(lines)
    assert f"outputs in {work}:" in text and "checkpoints/" in text and "steps 3, 2" in text
    assert "metrics.jsonl" in text and "eval_after.json" in text
    for command in (f"kljax plot-run {work}", f"kljax generate --checkpoint {work}", f"kljax export {work} --out"):
        assert command in text, text


def test_report_to_names_are_checked():
    from kljax.config.sections import LoggingSection

    assert LoggingSection("tensorboard, wandb").reporters == ("tensorboard", "wandb")
    assert LoggingSection("none").reporters == () and LoggingSection("").reporters == ()
    assert LoggingSection("all").reporters == tracking.TRACKERS
    with pytest.raises(UserError, match=r"unknown tracker\(s\) \['comet'\]"):
        LoggingSection("wandb,comet")
    with pytest.raises(UserError, match=r"an empty tracker name"):
        LoggingSection(",")


@pytest.mark.parametrize("name,package", [("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_tracker_not_installed_fails_the_run_up_front_naming_the_extra(tmp_path, capsys, monkeypatch, name,
                                                                         package):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    code = main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"), "--no-progress",
                 f"--config.logging.report_to=tensorboard,{name}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("kljax train: error: logging.report_to") and "kljax[track]" in err[0]
    assert not (tmp_path / "w").exists()


def test_a_resumed_run_reports_to_the_same_tracked_runs(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow is in the track extra (pip install 'kljax[track]')")
    from mlflow.tracking import MlflowClient

    from kljax.config import load_run_config

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    config = load_run_config({"steps": 4, "logging": {"report_to": "mlflow", "project": "p", "run_name": ""}})
    work = tmp_path / "run"
    work.mkdir()
    first = tracking.open_trackers(config, work, resume=False)
    first[0].log(1, {"reward": 0.5, "kl_seq": float("nan")})
    first[0].close()
    again = tracking.open_trackers(config, work, resume=True)
    again[0].log(2, {"reward": 0.75})
    again[0].close()
    fresh = tracking.open_trackers(config, tmp_path / "run", resume=False)  # a new run: a new tracked run
    fresh[0].close()
    run_id = first[0].run_id
    assert again[0].run_id == run_id != fresh[0].run_id
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "reward")] == [(1, 0.5), (2, 0.75)]
    assert client.get_metric_history(run_id, "kl_seq") == []  # NaN left out, as metrics.jsonl's null


@pytest.mark.parametrize("stop,message", [("['x']", "cannot write 'x'"), ("[99]", "token id 99 is beyond")])
def test_a_stop_the_tokenizer_cannot_write_fails_before_anything_runs(tmp_path, capsys, monkeypatch, stop, message):
    from kljax.train import trainer

    def built(*_, **__):
        raise AssertionError("the train state was built before the stop was checked")

    monkeypatch.setattr(trainer.st, "state_from_params", built)
    work = tmp_path / "w"
    code = main(["train", "--config", "configs/tiny.py", "--workdir", str(work), "--no-progress",
                 f"--config.rl.stop={stop}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (work / "eval_before.json").exists() and not (work / "metrics.jsonl").exists()
