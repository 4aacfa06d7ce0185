"""YAML and JSON run configs beside Python ones: the same fields over the run defaults, the same
validation, and every fault one line `kljax train: error: ...` naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kljax.cli import main
from kljax.errors import UserError
from kljax.train.config import load_config, validate
from kljax.train.config_checks import default_config

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_yaml_config_sets_nested_and_dotted_fields_over_the_defaults(tmp_path):
    path = _write(tmp_path, "run.yaml", "steps: 7\nmodel:\n  source: tiny\nrl.temperature: 1\n"
                                        "optim: {learning_rate: 0.001}\ntask:\n  name: repeat_digit\n")
    config = load_config(path)
    assert config.steps == 7 and config.model.source == "tiny" and config.task.name == "repeat_digit"
    assert config.rl.temperature == 1.0 and isinstance(config.rl.temperature, float)
    assert config.optim.learning_rate == 1e-3
    defaults = default_config()
    assert config.rl.group_size == defaults.rl.group_size and config.kl.to_dict() == defaults.kl.to_dict()
    settings = validate(config)
    assert settings.steps == 7 and settings.rl.temperature == 1.0


def test_json_config_and_a_runs_own_config_json_load_back(tmp_path):
    tiny = load_config(ROOT / "configs" / "tiny.py")
    path = _write(tmp_path, "config.json", json.dumps(tiny.to_dict(), indent=2))  # what `kljax train` writes
    assert load_config(path).to_dict() == tiny.to_dict()
    small = _write(tmp_path, "run.json", json.dumps({"kl": {"estimator": "k3", "placement": "loss"}}))
    config = load_config(small)
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
        load_config(path)
    message = str(e.value)
    assert "\n" not in message
    for part in expect:
        assert part in message, message


def test_yaml_values_get_the_python_configs_validation(tmp_path):
    path = _write(tmp_path, "run.yaml", "rl:\n  temperature: hot\n")
    with pytest.raises(UserError, match=r"config.rl.temperature='hot' is a str; expected a float"):
        validate(load_config(path))


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
