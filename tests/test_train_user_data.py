"""A short training run on the user's own JSONL, reward file and a reward model (tiny models):
per-function rewards, epochs resumed where they stopped, evaluation during training, samples.jsonl,
one line per step, JSON files without NaN; and out and back: `kljax export` to an HF checkpoint that
transformers loads with the same logits, `kljax eval` and `kljax generate --checkpoint` on the run."""

from __future__ import annotations

import contextlib
import io
import json

import jax
import numpy as np
import pytest

from kljax.cli import main as cli_main
from kljax.config import load_run_config
from kljax.models import transformer as tfm
from kljax.models.tokenizers import CharTokenizer
from kljax.train import restore
from kljax.train.metrics import deterministic, read_jsonl
from kljax.train.trainer import train

REWARD = '''
def digits(prompts, completions, answer, level, **kw):
    assert len(answer) == len(level) == len(completions)
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''


def user_run(tmp_path, reward_model=False):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a % 7}=", "answer": str(a + a % 7), "level": a % 3}) + "\n"
                            for a in range(10)))
    (tmp_path / "my_reward.py").write_text(REWARD)
    return [
        "--config.task.name=jsonl", f"--config.task.path={data}", "--config.task.answer_key=answer",
        "--config.task.eval_splits=test", "--config.task.eval_fraction=0.2",
        f"--config.reward.functions={tmp_path / 'my_reward.py'}:digits,exact_match",
        "--config.reward.weights=(1.0,2.0)",
        "--config.steps=4", "--config.checkpoint_every=100", "--config.eval_every=2", "--config.log_samples_every=2",
        "--config.log_samples_n=3", "--config.rl.prompts_per_step=4", "--config.mesh.fsdp=4", "--config.mesh.tensor=2",
    ] + ([f"--config.reward.model={save_reward_model(tmp_path / 'rm')}", "--config.reward.model_weight=0.5"]
         if reward_model else [])


def save_reward_model(path):
    pytest.importorskip("torch")
    from benchmarks.rl import save_char_tokenizer
    from tests.test_reward_model import save_tiny_reward_model

    save_tiny_reward_model("llama3", path)
    save_char_tokenizer(path, vocab_size=96)
    return path


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """(tmp dir, overrides, workdir, stdout) of a 4-step CLI run with --no-progress."""
    tmp = tmp_path_factory.mktemp("user_run")
    overrides = user_run(tmp, reward_model=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp / "full"), "--no-progress",
                         *overrides])
    assert code == 0, out.getvalue()[-2000:]
    return tmp, overrides, tmp / "full", out.getvalue()


def test_what_the_run_writes(full_run):
    _, _, full, stdout = full_run
    lines = [ln for ln in stdout.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert "rewards/digits/mean=" in lines[0] and "eval/test/accuracy=" in lines[1]
    rows = read_jsonl(full / "metrics.jsonl")
    for r in rows:
        want = r["rewards/digits/mean"] + 2 * r["rewards/exact_match/mean"] + 0.5 * r["rewards/reward_model/mean"]
        assert abs(r["reward"] - want) < 1e-5 and r["rewards/reward_model/mean"] != 0
    assert "eval/test/accuracy" in rows[1] and "eval/test/accuracy" not in rows[0]
    assert [r["epoch"] for r in rows] == pytest.approx([0.5, 1.0, 1.5, 2.0])  # 4 of the 8 train rows a step
    assert json.loads((full / "eval_step_2.json").read_text())["test"]["n"] == 2
    samples = [json.loads(ln) for ln in (full / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 2, 2, 4, 4, 4]
    assert set(samples[0]["rewards"]) == {"digits", "exact_match", "reward_model"}
    assert all(isinstance(s["kl"], float) and isinstance(s["advantage"], float) for s in samples)
    for name in ("eval_before.json", "eval_after.json", "eval_step_2.json"):
        assert "NaN" not in (full / name).read_text()


def test_plot_run_shows_kl_configuration_beta_and_evaluations(full_run):
    from kljax.cli.plot_run import eval_points, plot_run, run_title

    full = full_run[2]
    kl = json.loads((full / "config.json").read_text())["kl"]
    title = run_title(full)
    assert f"KL {kl['estimator']} in {kl['placement']}" in title and f"beta {kl['beta']}" in title
    assert [s for s, _ in eval_points(full, read_jsonl(full / "metrics.jsonl"))["test"]] == [0, 2, 4]
    assert plot_run(full).stat().st_size > 10_000


def test_resume_continues_the_epochs_where_they_stopped(full_run):
    tmp, overrides, full, _ = full_run
    # Stopped after 3 steps (an epoch of 8 train rows is 2 steps) and resumed: the same run.
    config = load_run_config(("configs/tiny.py"), overrides)
    split = tmp / "split"
    assert train(config, split, progress=False, stop_after=3)["stopped_at"] == 3
    train(config, split, resume=True, progress=False)
    want = [deterministic(r) for r in read_jsonl(full / "metrics.jsonl")]
    assert [deterministic(r) for r in read_jsonl(split / "metrics.jsonl")] == want
    assert (split / "samples.jsonl").read_text() == (full / "samples.jsonl").read_text()
    meta = json.loads(next((split / "checkpoints").glob("4/meta/metadata")).read_text())
    assert meta["data_position"] == 16
    assert meta["num_tokens"] == want[-1]["num_tokens"] > 0  # TRL's num_tokens, checkpointed


def test_export_loads_in_transformers_with_the_same_logits(full_run, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    workdir = full_run[2]
    out = tmp_path / "hf"
    assert cli_main(["export", str(workdir), "--out", str(out)]) == 0
    assert "exported step 4" in capsys.readouterr().out
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "12+3=45"
    ids = CharTokenizer().encode(text)
    assert tokenizer.encode(text, add_special_tokens=False) == ids and tokenizer.decode(ids) == text
    params, policy, _, step = restore.restore_params(workdir)
    want = np.asarray(tfm.apply(jax.device_get(params), np.asarray([ids], np.int32), config=policy.model))
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert cli_main(["export", str(workdir), "--out", str(out)]) == 2  # not over a non-empty --out
    assert "--overwrite" in capsys.readouterr().err
    assert cli_main(["export", str(workdir), "--out", str(out), "--overwrite", "--step", "4"]) == 0
    capsys.readouterr()
    for command in (["convert", "--export", "--model", str(workdir), "--out", str(tmp_path / "x")],
                    ["generate", "--model", str(workdir), "--prompt", "1+1="]):
        assert cli_main(command) == 2  # a workdir where a model directory belongs points to `kljax export`
        assert f"kljax export {workdir} --out DIR" in capsys.readouterr().err


def test_eval_and_generate_from_the_runs_checkpoint(full_run, tmp_path, capsys):
    workdir = full_run[2]
    report = tmp_path / "eval.json"
    assert cli_main(["eval", "--checkpoint", str(workdir), "--k", "1", "--no-progress", "--json", str(report)]) == 0
    payload = json.loads(report.read_text())
    assert list(payload["results"]) == ["jsonl:test"] and payload["results"]["jsonl:test"]["n"] == 2
    assert "NaN" not in report.read_text()
    capsys.readouterr()
    assert cli_main(["generate", "--checkpoint", str(workdir), "--prompt", "1+1=", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out) <= 3 and set(out) <= set(CharTokenizer().alphabet)


def test_a_failing_user_reward_stops_the_run_with_exit_2(tmp_path, capsys):
    (tmp_path / "bad.py").write_text("def bad(prompts, completions, **kw):\n    return [1.0]\n")
    code = cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"), "--no-progress",
                     *user_run(tmp_path)[:5], f"--config.reward.functions={tmp_path / 'bad.py'}:bad",
                     "--config.steps=2", "--config.mesh.fsdp=4", "--config.mesh.tensor=2"])
    err = capsys.readouterr().err
    assert code == 2 and "reward function 'bad'" in err and "wrong length" in err
