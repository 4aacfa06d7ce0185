"""A short training run on the user's own JSONL, reward file and a reward model (tiny models):
per-function rewards, epochs resumed where they stopped, evaluation during training, samples.jsonl,
one line per step, and JSON files without NaN."""

from __future__ import annotations

import json

import pytest

from kljax.cli import main as cli_main
from kljax.metrics import deterministic, read_jsonl
from kljax.train.config import apply_overrides, load_config
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
    from kljax.bench.rl import save_char_tokenizer
    from tests.test_reward_model import save_tiny_reward_model

    save_tiny_reward_model("llama3", path)
    save_char_tokenizer(path, vocab_size=96)
    return path


def test_user_data_and_reward_run_and_resume(tmp_path, capsys):
    overrides = user_run(tmp_path, reward_model=True)
    full = tmp_path / "full"
    assert cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(full), "--no-progress", *overrides]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["1/4", "2/4", "3/4", "4/4"]
    assert "reward/digits=" in lines[0] and "eval/test/accuracy=" in lines[1]
    rows = read_jsonl(full / "metrics.jsonl")
    for r in rows:
        want = r["reward/digits"] + 2 * r["reward/exact_match"] + 0.5 * r["reward/reward_model"]
        assert abs(r["reward"] - want) < 1e-5 and r["reward/reward_model"] != 0
    assert "eval/test/accuracy" in rows[1] and "eval/test/accuracy" not in rows[0]
    assert json.loads((full / "eval_step_2.json").read_text())["test"]["n"] == 2
    samples = [json.loads(ln) for ln in (full / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 2, 2, 4, 4, 4]
    assert set(samples[0]["rewards"]) == {"digits", "exact_match", "reward_model"}
    assert all(isinstance(s["kl"], float) and isinstance(s["advantage"], float) for s in samples)
    for name in ("eval_before.json", "eval_after.json", "eval_step_2.json"):
        assert "NaN" not in (full / name).read_text()

    # Stopped after 3 steps (an epoch of 8 train rows is 2 steps) and resumed: the same run.
    config = apply_overrides(load_config("configs/tiny.py"), overrides)
    split = tmp_path / "split"
    assert train(config, split, progress=False, stop_after=3)["stopped_at"] == 3
    train(config, split, resume=True, progress=False)
    assert [deterministic(r) for r in read_jsonl(split / "metrics.jsonl")] == [deterministic(r) for r in rows]
    assert (split / "samples.jsonl").read_text() == (full / "samples.jsonl").read_text()
    meta = json.loads(next((split / "checkpoints").glob("4/meta/metadata")).read_text())
    assert meta["data_position"] == 16


def test_a_failing_user_reward_stops_the_run_with_exit_2(tmp_path, capsys):
    (tmp_path / "bad.py").write_text("def bad(prompts, completions, **kw):\n    return [1.0]\n")
    code = cli_main(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"), "--no-progress",
                     *user_run(tmp_path)[:5], f"--config.reward.functions={tmp_path / 'bad.py'}:bad",
                     "--config.steps=2", "--config.mesh.fsdp=4", "--config.mesh.tensor=2"])
    err = capsys.readouterr().err
    assert code == 2 and "reward function 'bad'" in err and "wrong length" in err
