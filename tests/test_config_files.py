"""Run configs in every form: a dict, YAML, JSON and Python files and CLI overrides are the same
fields over the same defaults (the default run), with the same validation; every fault is one line
`kljax train: error: ...` naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kljax.cli import main
from kljax.config import RunConfig, load_run_config
from kljax.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_config_sets_nested_and_dotted_fields_over_the_defaults(tmp_path):
    path = _write(tmp_path, "run.yaml", "steps: 7\nmodel:\n  source: tiny\nrl.temperature: 1\n"
                                        "optim: {learning_rate: 0.001}\ntask:\n  name: repeat_digit\n")
    config = load_run_config(path)
    assert config.steps == 7 and config.model.source == "tiny" and config.task.name == "repeat_digit"
    assert config.rl.temperature == 1.0 and isinstance(config.rl.temperature, float)
    assert config.optim.learning_rate == 1e-3
    defaults = RunConfig()
    assert config.rl.group_size == defaults.rl.group_size and config.kl == defaults.kl


def test_json_config_and_a_runs_own_config_json_load_back(tmp_path):
    tiny = load_run_config(ROOT / "configs" / "tiny.py")
    path = _write(tmp_path, "config.json", json.dumps(tiny.to_dict(), indent=2))  # what `kljax train` writes
    assert load_run_config(path).to_dict() == tiny.to_dict()
    small = _write(tmp_path, "run.json", json.dumps({"kl": {"estimator": "k3", "placement": "loss"}}))
    config = load_run_config(small)
    assert (config.kl.estimator, config.kl.placement) == ("k3", "loss")


@pytest.mark.parametrize("name,text,expect", [
    ("bad.yaml", "steps: 3\nrl:\n  temprature: 0.5\nfoo: 1\n",
     ["bad.yaml", "rl.temprature (did you mean 'temperature'?)", "foo"]),
    ("bad.json", '{"kl": {"estimatr": "k3"}}', ["bad.json", "kl.estimatr", "valid in kl: adapt_horizon"]),
    ("syntax.yaml", "steps: 3\nrl: [1,\n", ["syntax.yaml", "not valid YAML", "line"]),
    ("syntax.json", '{"steps": 3,,}', ["syntax.json", "not valid JSON", "line 1"]),
    ("list.yaml", "- 1\n- 2\n", ["list.yaml", "holds a list, not a mapping"]),
    ("run.toml", "steps = 3\n", ["run.toml", "not a .py, .yaml, .yml or .json file"]),
])
def test_bad_files_are_one_user_error_naming_the_file(tmp_path, name, text, expect):
    path = _write(tmp_path, name, text)
    with pytest.raises(UserError) as e:
        load_run_config(path)
    message = str(e.value)
    assert "\n" not in message
    for part in expect:
        assert part in message, message


def test_yaml_values_get_the_python_configs_validation(tmp_path):
    path = _write(tmp_path, "run.yaml", "rl:\n  temperature: hot\n")
    with pytest.raises(UserError, match=r"config.rl.temperature='hot' is a str; expected a float"):
        load_run_config(path)


def test_train_cli_names_the_yaml_files_fault_in_one_line(tmp_path, capsys):
    path = _write(tmp_path, "run.yaml", "model: {source: tiny}\nrl: {top_q: 0.9}\n")
    code = main(["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("kljax train: error: config file") and "run.yaml" in err[0] and "rl.top_q" in err[0]
    assert not (tmp_path / "w").exists()


def test_train_cli_overrides_apply_over_a_yaml_config(tmp_path, capsys):
    path = _write(tmp_path, "run.yaml", "model: {source: tiny}\nrl: {temperature: 1.0}\n")
    code = main(["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--no-progress",
                 "--config.rl.top_p=1.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "rl.top_p=1.5" in err[0], err


FIELDS = {"steps": 3, "model.source": "tiny", "rl": {"temperature": 1.0, "stop": ["0"], "group_size": 2},
          "kl.beta": 0.2, "task": {"name": "repeat_digit", "prompt_format": "raw"}, "logging.report_to": "none"}


def _dotted(fields: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in fields.items():
        out.update(_dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def test_a_dict_a_yaml_file_a_python_file_and_cli_overrides_give_the_same_config_json(tmp_path):
    import yaml

    from kljax.api import RLTrainer

    yaml_path = _write(tmp_path, "run.yaml", yaml.safe_dump(FIELDS))
    py_path = _write(tmp_path, "run.py", f"def get_config():\n    return {FIELDS!r}\n")
    overrides = [f"--config.{k}={v!r}" if isinstance(v, str) else f"--config.{k}={v}"
                 for k, v in _dotted(FIELDS).items()]
    configs = {
        "dict": RLTrainer(config=FIELDS).config,
        "yaml": RLTrainer(config=str(yaml_path)).config,
        "py": RLTrainer(config=str(py_path)).config,
        "cli": RLTrainer(overrides=overrides).config,
        "json": load_run_config(_write(tmp_path, "config.json", json.dumps(RLTrainer(config=FIELDS).config.to_dict()))),
    }
    written = {name: json.dumps(c.to_dict(), indent=2, sort_keys=True) for name, c in configs.items()}
    assert len(set(written.values())) == 1, written
    assert configs["cli"].rl.stop == ("0",) and configs["cli"].kl.beta == 0.2


def test_every_shipped_run_config_loads_and_the_default_is_the_defaults():
    for path in sorted((ROOT / "configs").glob("*.py")):
        if path.stem.startswith(("bias_", "sweep_", "experiment_")):
            continue
        config = load_run_config(path)
        assert json.loads(json.dumps(config.to_dict())) == config.to_dict()
    assert load_run_config(ROOT / "configs" / "default.py") == RunConfig() == load_run_config()


@pytest.mark.parametrize("fields,message", [
    ({"rl.temperature": 1.0, "rl": {"temperature": 2.0}}, "sets 'rl.temperature' twice"),
    ({"steps": "three"}, r"config.steps='three' is a str; expected an int"),
    ({"rl": 5}, r"sets section .rl. to 5 \(an int\)"),
    ({"max_completion_length": 8}, r"max_completion_length \(TRL's name; kljax's is rl.max_new_tokens\)"),
    ({"logging.report_to": ","}, "an empty tracker name"),
])
def test_bad_fields_are_one_user_error_naming_them(fields, message):
    with pytest.raises(UserError, match=message):
        load_run_config(fields)


def test_duplicate_yaml_and_json_keys_are_refused(tmp_path):
    with pytest.raises(UserError, match="sets 'steps' twice"):
        load_run_config(_write(tmp_path, "dup.yaml", "steps: 3\nsteps: 4\n"))
    with pytest.raises(UserError, match="sets 'steps' twice"):
        load_run_config(_write(tmp_path, "dup.json", '{"steps": 3, "steps": 4}'))


def test_an_override_wins_over_the_file_and_is_blamed_for_its_own_value(tmp_path):
    path = _write(tmp_path, "run.yaml", 'steps: "three"\n')
    assert load_run_config(path, ["--config.steps=1"]).steps == 1
    with pytest.raises(UserError, match=r"config.steps='three'"):
        load_run_config(path)


@pytest.mark.parametrize("body,message", [
    ("import sys\n\ndef get_config():\n    sys.exit(0)\n", r"called sys.exit\(0\)"),
    ("import os\n\ndef get_config():\n    os._exit(0)\n", r"called os._exit\(0\)"),
])
def test_a_python_config_that_exits_is_a_user_error(tmp_path, body, message):
    with pytest.raises(UserError, match=message):
        load_run_config(_write(tmp_path, "exits.py", body))
