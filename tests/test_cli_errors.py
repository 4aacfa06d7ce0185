"""Every command fails on a user error like `kljax train` does: exit 2, one line
`kljax COMMAND: error: ...` naming the bad value or file, no traceback, before anything compiles.

The bad inputs are generated (tests/bad_inputs.py): broken model directories (no or bad config.json,
unknown architecture, missing/extra/mis-shaped/non-finite tensors, empty/truncated/garbage
safetensors, broken index, duplicated tensors, bad tokenizer), broken config files, bad values and
wrong paths. Commands run in-process through `kljax.cli.main`; two run as subprocesses.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from bad_inputs import make_inputs
from error_lines import the_error_line

from kljax.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = "configs/tiny.py"
MODEL_DEFECTS = {  # name -> what the message must name besides the directory
    "missing_dir": "", "empty_dir": "no config.json", "bad_json": "not valid JSON",
    "list_json": "not a JSON object", "binary_json": "not valid JSON", "unknown_arch": "GPT2LMHeadModel",
    "no_hidden": "hidden_size", "str_hidden": "sixteen", "no_weights": "model.safetensors",
    "backup_only": "backup.safetensors", "missing_tensor": "model.norm.weight", "bad_shape": "model.norm.weight",
    "extra_tensor": "model.extra.weight", "nan_weights": "model.layers.1.mlp.up_proj.weight",
    "inf_weights": "model.embed_tokens.weight", "empty_st": "0 bytes", "short_st": "too short",
    "truncated_st": "truncated", "garbage_st": "garbage", "bad_header_st": "header is not JSON",
    "index_missing_shard": "part-1.safetensors", "index_bad_json": "not valid JSON",
    "duplicate_tensor": "model.norm.weight", "bad_tokenizer": "tokenizer",
}
MODEL_COMMANDS = {
    "generate": ["generate", "--model", "{dir}", "--prompt", "t1 t2"],
    "convert": ["convert", "--model", "{dir}", "--out", "{root}/converted_{name}"],
    "convert-check": ["convert", "--check", "--model", "{dir}"],
    "eval": ["eval", "--model", "{dir}", "--config", TINY, "--tasks", "repeat_digit:test", "--no-progress"],
    "train": ["train", "--config", TINY, "--workdir", "{root}/run_{name}", "--no-progress",
              "--config.model.source={dir}"],
}
# (id, argv, what the message must contain, may compile): {name} is a path of make_inputs.
OTHER_CASES = [
    ("generate-empty-prompt", ["generate", "--model", "{good_tok}", "--prompt", ""], "--prompt number 1 is empty"),
    ("generate-zero-tokens", ["generate", "--model", "{good_tok}", "--prompt", "t1", "--max-new-tokens", "0"],
     "--max-new-tokens=0"),
    ("generate-negative-tokens", ["generate", "--model", "{good_tok}", "--prompt", "t1", "--max-new-tokens", "-3"],
     "--max-new-tokens=-3"),
    ("generate-over-context", ["generate", "--model", "{good_tok}", "--prompt", "t1", "--max-new-tokens", "500"],
     "context of 64"),
    ("generate-no-tokenizer", ["generate", "--model", "{good}", "--prompt", "t1"], "{good} has no tokenizer"),
    ("generate-file-as-model", ["generate", "--model", "{a_file}", "--prompt", "t1"], "{a_file}"),
    ("convert-out-is-file", ["convert", "--model", "{good}", "--out", "{a_file}"],
     "--out {a_file} is a file; give a directory"),
    ("convert-no-out", ["convert", "--model", "{good}"], "--out is required"),
    ("convert-export-not-orbax", ["convert", "--export", "--model", "{good}", "--out", "{root}/exp"],
     "{good} is not a kljax orbax model dir"),
    ("convert-out-has-params", ["convert", "--model", "{good}", "--out", "{with_params}"],
     "--out {with_params} is not empty and kljax did not write it"),
    ("eval-json-dir", ["eval", "--model", "tiny", "--config", TINY, "--json", "{root}", "--tasks", "repeat_digit"],
     "--json {root} is a directory"),
    ("eval-syntax-config", ["eval", "--model", "tiny", "--config", "{syntax_config}"], "syntax error at line 1"),
    ("eval-no-get-config", ["eval", "--model", "tiny", "--config", "{no_get_config}"], "has no get_config()"),
    ("eval-raising-config", ["eval", "--model", "tiny", "--config", "{raising_config}"], "ZeroDivisionError"),
    ("eval-missing-config", ["eval", "--model", "tiny", "--config", "{root}/nope.py"], "nope.py' does not exist"),
    ("eval-config-is-dir", ["eval", "--model", "tiny", "--config", "{root}"], "is a directory"),
    ("eval-no-model-section", ["eval", "--model", "tiny", "--config", "configs/bias_default.py"],
     "is a bias-study config, not a run config"),
    ("eval-unknown-task", ["eval", "--model", "tiny", "--config", TINY, "--tasks", "nosuch:test"], "'nosuch'", True),
    ("eval-unknown-split", ["eval", "--model", "tiny", "--config", TINY, "--tasks", "repeat_digit:nosplit"],
     "nosplit", True),
    ("eval-missing-data-dir", ["eval", "--model", "tiny", "--config", TINY, "--tasks", "math500:test",
                               "--config.task.data_dir={root}/no_data"], "{root}/no_data", True),
    ("eval-empty-split", ["eval", "--model", "tiny", "--config", TINY, "--tasks", "gsm8k:test",
                          "--config.task.data_dir={data}"], "{data}/gsm8k/test.jsonl has no rows", True),
    ("eval-bad-override", ["eval", "--model", "tiny", "--config", TINY, "--config.rl.top_k=abc"], "'abc'"),
    ("eval-missing-checkpoint", ["eval", "--checkpoint", "{root}/no_run"], "{root}/no_run"),
    ("plan-devices-negative", ["plan", "--config", TINY, "--mesh", "fsdp=-1", "--devices", "-1"], "--devices=-1"),
    ("plan-devices-zero", ["plan", "--config", TINY, "--mesh", "fsdp=-1", "--devices", "0"], "--devices=0"),
    ("plan-syntax-config", ["plan", "--config", "{syntax_config}"], "syntax error"),
    ("plan-bad-mesh", ["plan", "--config", TINY, "--mesh", "fsdp=x"], "fsdp=x"),
    ("plan-bad-chip", ["plan", "--config", TINY, "--mesh", "fsdp=1", "--chip", "abacus"], "abacus"),
    ("plan-string-number", ["plan", "--config", TINY, "--mesh", "fsdp=1", "--config.rl.group_size=four"], "'four'"),
    ("plan-sweep-config", ["plan", "--config", "configs/sweep_tiny.py", "--mesh", "fsdp=1"],
     "is a sweep config, not a run config"),
    ("sweep-parallel-negative", ["sweep", "--config", "configs/sweep_tiny.py", "--out", "{root}/sw", "--parallel",
                                 "-1"], "--parallel=-1"),
    ("sweep-out-is-file", ["sweep", "--config", "configs/sweep_tiny.py", "--out", "{a_file}"], "{a_file}"),
    ("sweep-syntax-config", ["sweep", "--config", "{syntax_config}", "--out", "{root}/sw"], "syntax error"),
    ("sweep-missing-config", ["sweep", "--config", "{root}/nope.py", "--out", "{root}/sw"], "nope.py"),
    ("bias-out-is-file", ["bias-study", "--out", "{a_file}", "--exact"], "--out {a_file} is an existing file"),
    ("bias-json-is-dir", ["bias-study", "--json", "{root}", "--exact"], "--json {root} is a directory"),
    ("bias-syntax-config", ["bias-study", "--config", "{syntax_config}"], "syntax error"),
    ("bias-raising-config", ["bias-study", "--config", "{raising_config}"], "ZeroDivisionError"),
    ("bias-zero-samples", ["bias-study", "--samples", "0", "--no-progress"], "samples"),
    ("bias-unknown-config", ["bias-study", "--configs", "k9-nowhere", "--no-progress"], "k9-nowhere"),
    ("report-missing-dir", ["report", "{root}/no_sweep"], "{root}/no_sweep"),
    ("report-no-summary", ["report", "{empty_dir}"], "{empty_dir}/summary.json"),
    ("report-garbage-summary", ["report", "{garbage_sweep}"], "{garbage_sweep}/summary.json"),
    ("plot-missing-dir", ["plot-run", "{root}/no_run"], "{root}/no_run"),
    ("plot-empty-dir", ["plot-run", "{empty_dir}"], "{empty_dir}"),
    ("plot-garbage-metrics", ["plot-run", "{garbage_run}"], "{garbage_run}/metrics.jsonl"),
    ("export-missing-workdir", ["export", "{root}/no_run", "--out", "{root}/exported"], "{root}/no_run"),
    ("export-garbage-config", ["export", "{garbage_run}", "--out", "{root}/exported"],
     "{garbage_run}/config.json is not valid JSON"),
    ("eval-checkpoint-garbage-config", ["eval", "--checkpoint", "{garbage_run}"], "{garbage_run}/config.json"),
    ("audit-unknown-peer", ["audit", "{root}/nowhere"], "{root}/nowhere"),
    ("kl-configs-bad-aggregation", ["kl-configs", "--aggregation", "bogus"], "'bogus'"),
    ("train-syntax-config", ["train", "--config", "{syntax_config}", "--workdir", "{root}/t"], "syntax error"),
    ("train-raising-config", ["train", "--config", "{raising_config}", "--workdir", "{root}/t"], "ZeroDivisionError"),
    ("train-no-get-config", ["train", "--config", "{no_get_config}", "--workdir", "{root}/t"], "get_config()"),
    ("train-string-in-section", ["train", "--config", "{string_section_config}", "--workdir", "{root}/t"],
     "config.rl.top_k='5'"),
    ("train-section-not-a-mapping", ["train", "--config", "{no_rl_config}", "--workdir", "{root}/t"], "'rl' to 5"),
    ("train-override-missing-section", ["train", "--config", "{no_rl_config}", "--workdir", "{root}/t",
                                        "--config.rl.top_k=1"], "'rl'"),
    ("train-resume-empty", ["train", "--config", TINY, "--workdir", "{root}/t_empty", "--resume"],
     "--resume=auto"),
    ("train-resume-bad-mode", ["train", "--config", TINY, "--workdir", "{root}/t", "--resume=maybe"], "maybe"),
    ("train-missing-data-dir", ["train", "--config", TINY, "--workdir", "{root}/t", "--config.task.name=gsm8k",
                                "--config.task.data_dir={root}/no_data"], "{root}/no_data", True),
    ("train-empty-split", ["train", "--config", TINY, "--workdir", "{root}/t", "--config.task.name=gsm8k",
                           "--config.task.split=test", "--config.task.data_dir={data}"],
     "test.jsonl has no rows", True),
    ("train-unknown-estimator", ["train", "--config", TINY, "--workdir", "{root}/t", "--config.kl.estimator=k9"],
     "'k9'"),
]
BAD_VALUES = [  # `kljax train --config configs/tiny.py --config.FIELD=VALUE`, refused naming FIELD and VALUE
    ("kl.beta", "-1"), ("kl.beta", "1e999"), ("kl.beta", "nan"), ("kl.beta", "inf"), ("optim.b1", "1.0"),
    ("optim.b1", "-0.5"), ("optim.b2", "1.5"), ("optim.eps", "0"), ("optim.eps", "-1e-8"),
    ("optim.weight_decay", "-0.1"), ("optim.learning_rate", "0"), ("optim.learning_rate", "1e999"),
    ("optim.max_grad_norm", "0"), ("optim.end_lr_fraction", "2.0"), ("rl.clip_low", "-0.1"), ("rl.clip_low", "1.5"),
    ("rl.clip_high", "-1"), ("rl.temperature", "-1"), ("rl.top_p", "0"), ("rl.top_k", "-2"), ("seed", "-1"),
    ("seed", "3.5"), ("steps", "0"), ("rl.max_new_tokens", "0"), ("rl.max_prompt_len", "-4"),
    ("rl.group_size", "abc"), ("rl.prompts_per_step", "0"), ("mesh.fsdp", "0"), ("eval_examples", "0"),
    ("checkpoint_every", "0"), ("kl.target_kl", "-1.0"), ("model.dtype", "float8"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    p = make_inputs(root)
    p["root"] = root
    (root / "with_params" / "params").mkdir(parents=True)
    p["with_params"] = root / "with_params"
    (root / "data" / "gsm8k").mkdir(parents=True)
    (root / "data" / "gsm8k" / "test.jsonl").write_text("\n\n")
    p["data"] = root / "data"
    (root / "garbage_sweep").mkdir()
    (root / "garbage_sweep" / "summary.json").write_bytes(b"\x00\x01{{{ not json")
    p["garbage_sweep"] = root / "garbage_sweep"
    (root / "garbage_run").mkdir()
    (root / "garbage_run" / "metrics.jsonl").write_text("{not json\n")
    (root / "garbage_run" / "config.json").write_text("{not json")
    p["garbage_run"] = root / "garbage_run"
    (root / "string_section.py").write_text(
        "def get_config():\n    return {'model.source': 'tiny', 'rl': {'top_k': '5'}}\n")
    p["string_section_config"] = root / "string_section.py"
    (root / "no_rl.py").write_text("def get_config():\n    return {'model.source': 'tiny', 'rl': 5}\n")
    p["no_rl_config"] = root / "no_rl.py"
    return p


class Compiles:
    """Counts JAX compilations (tracing or backend) while active."""

    def __init__(self) -> None:
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, *_: object, **__: object) -> None:
        if name.startswith("/jax/core/compile/"):
            self.count += 1


@pytest.fixture(scope="module")
def compiles() -> Compiles:
    return Compiles()


def _fill(items: list[str], p: dict[str, Path], **extra: str) -> list[str]:
    names = {k: str(v) for k, v in p.items()} | extra
    return [item.format(**names) for item in items]


def check_fails_cleanly(argv: list[str], expected: str, capsys, compiles: Compiles, may_compile: bool = False) -> str:
    """main(argv) exits 2 with one named error line, no traceback and (unless may_compile) before any
    compilation. Returns the error line."""
    before = compiles.count
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, out[-1000:], err[-2000:])
    assert "Traceback" not in out + err, err[-2000:]
    line = the_error_line(err, argv[0])
    assert expected in line, (expected, line)
    if not may_compile:
        assert compiles.count == before, f"{argv}: compiled before failing"
    return line


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
@pytest.mark.parametrize("defect", list(MODEL_DEFECTS))
def test_broken_model_directory(inputs, compiles, capsys, command, defect):
    argv = _fill(MODEL_COMMANDS[command], inputs, dir=str(inputs[defect]), name=defect)
    line = check_fails_cleanly(argv, MODEL_DEFECTS[defect], capsys, compiles)
    assert str(inputs[defect]) in line


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_bad_input(inputs, compiles, capsys, case):
    _, argv, expected, *may_compile = case
    check_fails_cleanly(_fill(argv, inputs), _fill([expected], inputs)[0], capsys, compiles, bool(may_compile))


@pytest.mark.parametrize("field,value", BAD_VALUES, ids=[f"{f}={v}" for f, v in BAD_VALUES])
def test_bad_config_value(inputs, compiles, capsys, field, value):
    argv = ["train", "--config", TINY, "--workdir", str(inputs["root"] / "never"), f"--config.{field}={value}"]
    line = check_fails_cleanly(argv, field, capsys, compiles)
    try:
        shown = repr(ast.literal_eval(value))
    except (ValueError, SyntaxError):
        shown = value
    assert value in line or shown in line, line
    assert not (inputs["root"] / "never").exists()  # refused before the workdir was made


def test_hundred_bad_inputs_are_covered():
    assert len(MODEL_DEFECTS) * len(MODEL_COMMANDS) + len(OTHER_CASES) + len(BAD_VALUES) >= 100


def test_subprocess_one_line_and_debug_traceback(inputs):
    argv = [sys.executable, "-m", "kljax", "generate", "--model", str(inputs["garbage_st"]), "--prompt", "t1"]
    plain = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines()[-1].startswith("kljax generate: error: ")
    assert str(inputs["garbage_st"] / "model.safetensors") in plain.stderr
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UserError" in debug.stderr


def test_config_json_written_by_a_run_is_still_valid(tmp_path):
    """The type checks accept what a run writes and reads back (config.json of a workdir)."""
    from kljax.config import load_run_config

    for name in ("tiny.py", "default.py"):
        config = load_run_config(ROOT / "configs" / name)
        assert load_run_config(json.loads(json.dumps(config.to_dict()))) == config
