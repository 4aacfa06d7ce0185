"""The README stays true: CI runs its test command verbatim, the main-job command names a
subcommand that exists, the sections a newcomer needs come first, every linked file exists, the
command table lists every command, and its examples (the end-of-run listing, the YAML config) are
what kljax prints and accepts."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import numpy as np
import pytest

from kljax.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README must open with a bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    main_job, test_cmd = readme_commands()[:2]
    assert "pytest" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text().splitlines()
    assert main_job.startswith("bash launch/setup.sh && .venv/bin/kljax ")


def test_main_job_subcommand_exists():
    main_job = readme_commands()[0]
    sub = main_job.split(".venv/bin/kljax ")[1].split()[0]
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    assert sub in choices, f"README main job uses 'kljax {sub}', which is not a command: {sorted(choices)}"


def _section_starts(text: str) -> dict[str, int]:
    return {line[3:]: i for i, line in enumerate(text.splitlines()) if line.startswith("## ")}


def test_readme_leads_a_newcomer_from_the_api_to_the_commands():
    """After the set-up: the Python API, Coming from TRL, the KL table, then the commands; the
    measurements and host tuning live in docs/."""
    text = (ROOT / "README.md").read_text()
    at = _section_starts(text)
    order = ["Python API", "Coming from TRL", "The KL configurations, in a practitioner's words", "Command line"]
    assert all(name in at for name in order), sorted(at)
    assert [at[n] for n in order] == sorted(at[n] for n in order)
    assert at["Python API"] == min(at.values())
    for moved in ("Experiments: does this scale agree with the paper?", "Performance", "Host memory"):
        assert f"## {moved}\n" not in text and f"### {moved}\n" not in text


def test_every_link_to_a_file_exists():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_command_table_lists_every_command():
    text = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `kljax ([a-z-]+)", text, re.M))
    choices = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert listed == set(choices)


def test_the_end_of_run_listing_is_what_kljax_train_prints(tmp_path, monkeypatch):
    """The README's example of the lines `kljax train` ends with (kljax/train/run_outputs.py) for a
    workdir holding what the default run writes; only the checkpoints' size differs."""
    from kljax.train import run_outputs
    from kljax.train.run_outputs import output_lines

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(outputs in runs/default:\n.*?)```", text, re.S)
    assert block, "README shows the end-of-run listing"
    shown = block.group(1).rstrip("\n").splitlines()
    monkeypatch.chdir(tmp_path)
    work = Path("runs/default")
    step = re.search(r"checkpoints/ +step (\d+)", shown[1]).group(1)
    (work / "checkpoints" / step).mkdir(parents=True)
    (work / "checkpoints" / step / "state").write_bytes(b"0" * 1000)
    (work / "tb").mkdir()
    for name in ("metrics.jsonl", "eval_before.json"):
        (work / name).write_text("{}\n")
    prompt = re.search(r"--prompt '([^']*)'", block.group(1)).group(1)  # the first problem of the evaluation
    (work / "eval_after.json").write_text(json.dumps({"test": {"example": {"prompt": prompt}}}))
    (work / "config.json").write_text('{"task": {"name": "arithmetic"}}')
    monkeypatch.setattr(run_outputs, "tensorboard_command", lambda kljax: None)  # launch/setup.sh installs none
    printed = output_lines(work, kljax=".venv/bin/kljax")  # launch/setup.sh's, from the checkout

    def without_size(lines: list[str]) -> list[str]:
        return [re.sub(r"state, [0-9.]+ [KMG]?i?B", "state, SIZE", line) for line in lines]

    assert without_size(shown) == without_size(printed)


def test_the_readme_yaml_config_is_a_valid_run_config(tmp_path):
    from kljax.config import load_run_config

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block
    path = tmp_path / "run.yaml"
    path.write_text(block.group(1))
    settings = load_run_config(path)
    assert settings.rl.stop == ("0",) and settings.rl.min_p == 0.05


def test_every_documented_export_writes_outside_the_run_it_reads(tmp_path, monkeypatch):
    """`kljax export RUN --out OUT` in the README and docs/: export refuses an OUT that is, lies
    inside or contains RUN (the run must survive), so no documented command may name one."""
    from kljax.errors import UserError
    from kljax.util.owned_paths import check_apart

    monkeypatch.chdir(tmp_path)
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for run, out in re.findall(r"kljax export (\S+) (?:\S+ )*?--out (\S+)", doc.read_text()):
            found.append((doc.name, run, out))
            try:
                check_apart(out, run)
            except UserError as e:
                raise AssertionError(f"{doc.name}: kljax export {run} --out {out}: {e}") from None
    assert len(found) >= 3, found


CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


def tiny_chat_model(out_dir: Path, alphabet: str) -> Path:
    """A tiny random transformer over `alphabet` (one token per character) whose tokenizer has a chat
    template, as a Hugging Face directory: an instruct model in miniature."""
    import jax
    from transformers import AutoTokenizer

    from kljax.models import transformer as tfm
    from kljax.models.config import ModelConfig
    from kljax.models.tokenizers import CharTokenizer
    from kljax.train.sft import export_char_model

    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=CharTokenizer(alphabet).vocab_size,
                         hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         max_position_embeddings=128, tie_embeddings=False, eos_token_ids=(1,), pad_token_id=0)
    export_char_model(tfm.init_params(config, jax.random.PRNGKey(0)), config, out_dir, alphabet)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return out_dir


def test_the_python_api_example_prompts_in_the_chat_template_and_scores_answers(tmp_path, monkeypatch):
    """The README's Python API example, run as written on a tiny random model with a chat template
    (instead of "default") for 2 steps: its rows are chat messages, so the model is prompted in its
    chat template (with plain-text prompts SmolLM2-135M-Instruct ended every response at once: reward 0
    and a gradient of 4e-12 at every step), and its reward function scores the completions it is given."""
    pytest.importorskip("transformers")
    from kljax.models.hf_tokenizer import load_hf_tokenizer
    from kljax.tasks.from_config import task_of
    from kljax.tasks.prompting import prompt_texts
    from kljax.train.reward_set import columns_of

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Python API\n.*?```python\n(.*?)```", text, re.S).group(1)
    assert 'model="default"' in code and '"steps": 50' in code
    alphabet = "".join(sorted(set(string.ascii_letters + string.digits + " ?<>.")))
    model_dir = tiny_chat_model(tmp_path / "tiny_chat", alphabet)
    code = code.replace('model="default"', f"model={str(model_dir)!r}")
    small = '"steps": 2, "eval_examples": 4, "rl.max_new_tokens": 8, "mesh.fsdp": 4, "mesh.tensor": 2'
    code = code.replace('"steps": 50', small)
    code = code.replace('trainer.save_pretrained("my-model")', "")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    trainer, correct, rows = namespace["trainer"], namespace["correct"], namespace["result"].metrics
    assert len(rows) == 2 and all(np.isfinite(r["reward"]) and r["response_length"] > 1 for r in rows)
    task = task_of(trainer.config)
    tokenizer = load_hf_tokenizer(model_dir)
    example = task.examples("train", n=1, seed=0)[0]
    shown = prompt_texts([example], task, tokenizer, str(trainer.config.task.prompt_format))[0]
    assert shown.startswith("<user>What is ") and shown.endswith("?<assistant>"), shown
    answer = columns_of([example])["answer"][0]  # the column the reward function is called with
    completions = [[{"role": "assistant", "content": f"It is {answer}."}], [{"role": "assistant", "content": "No."}]]
    assert correct(completions, [answer] * 2) == [1.0, 0.0]


def test_the_trl_job_runs_as_printed(tmp_path, monkeypatch):
    """README's "Coming from TRL" job, as printed but for a tiny random model and 2 steps: a GRPOConfig
    in, TRL's settings in config.json, TRL's metric names in metrics.jsonl, save_model's directory out."""
    pytest.importorskip("trl")
    from kljax.train.metrics import read_jsonl

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Coming from TRL\n.*?```python\n(.*?)```", text, re.S).group(1)
    assert "GRPOTrainer" not in code.replace("# was: from trl import GRPOConfig, GRPOTrainer", "").replace(
        "# was: GRPOTrainer(", "")
    alphabet = "".join(sorted(set(string.ascii_letters + string.digits + " ?<>.")))
    model_dir = tiny_chat_model(tmp_path / "tiny_chat", alphabet)
    for old, new in (('model="default"', f"model={str(model_dir)!r}"), ("max_steps=50", "max_steps=2"),
                     ("max_completion_length=64", "max_completion_length=6")):
        assert old in code
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    config = json.loads((tmp_path / "runs/trl/config.json").read_text())
    assert (config["kl"]["estimator"], config["kl"]["placement"], config["kl"]["beta"]) == ("k3", "loss", 0.04)
    assert config["rl"]["group_size"] == 4 and config["reward"]["weights"] == [1.0, 0.1]
    rows = read_jsonl(tmp_path / "runs/trl/metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("rewards/short/mean" in r for r in rows)
    assert (tmp_path / "my-model" / "config.json").is_file()
