"""Nothing a command writes can delete what it reads, and kljax deletes only directories it created:
`kljax export --out` apart from the run and only over an earlier export, sweep run names that are one
path component, a broken sweep run removed only with the sweep's marker, set-aside checkpoints kept."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kljax.cli import main as cli_main
from kljax.config import load_run_config
from kljax.errors import UserError
from kljax.studies import sweep as sweep_mod
from kljax.train import restore
from kljax.train.trainer import train
from kljax.util.owned_paths import MARKER, is_marked

MESH = {"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2}


def _one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(f"kljax {command}: error: "), err
    return err


@pytest.fixture(scope="module")
def run1(tmp_path_factory):
    """A finished 1-step tiny run (its checkpoint at step 1)."""
    workdir = tmp_path_factory.mktemp("run1")
    overrides = {**MESH, "steps": 1, "eval_examples": 8, "checkpoint_every": 1}
    train(load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in overrides.items()]),
          workdir, progress=False)
    return workdir


def _files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_export_refuses_an_out_that_is_inside_or_contains_the_run(run1, tmp_path, capsys):
    before = _files(run1)
    link = tmp_path / "link"
    link.symlink_to(run1)
    for out, what in ((run1, "is the run"), (run1 / "checkpoints", "lies inside the run"),
                      (run1.parent, "contains the run"), (link, "is the run"), (link / "checkpoints", "lies inside")):
        assert cli_main(["export", str(run1), "--out", str(out), "--overwrite"]) == 2
        assert what in _one_line_error(capsys, "export")
    assert _files(run1) == before  # nothing deleted, nothing written


def test_export_overwrites_only_an_earlier_export_and_follows_a_symlink(run1, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert cli_main(["export", str(run1), "--out", str(mine), "--overwrite"]) == 2  # not written by export
    assert "did not write it" in _one_line_error(capsys, "export")
    assert (mine / "notes.txt").read_text() == "keep me"
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert cli_main(["export", str(run1), "--out", str(link), "--overwrite"]) == 2  # a symlink to it: the same
    assert "did not write it" in _one_line_error(capsys, "export")
    target = tmp_path / "exported"
    target.mkdir()  # empty: fine without --overwrite
    link2 = tmp_path / "link2"
    link2.symlink_to(target)
    assert cli_main(["export", str(run1), "--out", str(link2)]) == 0
    assert is_marked(target) and (target / "config.json").is_file() and link2.is_symlink()
    (target / "stale.txt").write_text("from the first export")
    assert cli_main(["export", str(run1), "--out", str(link2), "--overwrite"]) == 0  # replaced, through the link
    assert not (target / "stale.txt").exists() and (target / "kljax_export.json").is_file() and link2.is_symlink()
    capsys.readouterr()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left


def test_export_hf_overwrite_deletes_only_its_own_output(run1, tmp_path):
    from kljax.models.convert import export_hf

    params, policy, _, _ = restore.restore_params(run1)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="kljax does not delete it"):
        export_hf(params, policy.model, out, overwrite=True)
    assert sorted(os.listdir(out)) == ["mine.txt"]
    written = export_hf(params, policy.model, tmp_path / "hf2")
    (written / "extra.txt").write_text("from before")
    export_hf(params, policy.model, written, overwrite=True)  # its own earlier output: replaced
    assert is_marked(written) and not (written / "extra.txt").exists()


def test_sweep_run_names_are_one_path_component(tmp_path, capsys):
    for variant in ("/../../../victim", "a/b", "..", ""):
        with pytest.raises(ValueError, match="single path component"):
            sweep_mod.sweep_from_spec({"base_config": "tiny.py", "beta": [0.1], "variants": {variant: []}})
    config = tmp_path / "sweep_bad.py"
    config.write_text("def get_config():\n    return {'base_config': 'tiny.py', 'beta': [0.1], "
                      "'variants': {'/../../../victim': []}}\n")
    assert cli_main(["sweep", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "single path component" in _one_line_error(capsys, "sweep")
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "victim").exists()


def test_sweep_refuses_an_empty_beta_list():
    for beta in ([], None):
        with pytest.raises(ValueError, match="gives no beta for the KL configuration k1-reward"):
            sweep_mod.sweep_from_spec({"base_config": "tiny.py", "kl": ["k1-reward"], "beta": beta})
    sweep = sweep_mod.sweep_from_spec({"base_config": "tiny.py", "kl": ["none"], "beta": []})  # no KL: no beta
    assert [p.beta for p in sweep.points] == [None]


def test_broken_sweep_run_is_removed_only_when_the_sweep_created_it(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data.txt").write_text("not a run")
    runs = tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    (runs / "linked").symlink_to(victim)
    (runs / "foreign").mkdir()
    (runs / "foreign" / "data.txt").write_text("not a run")
    for name in ("linked", "foreign"):
        with pytest.raises(UserError, match="kljax does not delete it"):
            sweep_mod._prepare(runs / name)
    assert (victim / "data.txt").is_file() and (runs / "foreign" / "data.txt").is_file()
    assert sweep_mod._prepare(runs / "new") == (False, False)  # created with the marker
    assert is_marked(runs / "new")
    (runs / "new" / "train.log").write_text("died before its first checkpoint")
    assert sweep_mod._prepare(runs / "new") == (False, False)  # broken, the sweep's own: started over
    assert sorted(os.listdir(runs / "new")) == [MARKER]


def test_cut_eval_after_json_is_named_in_one_line(tmp_path, capsys):
    config = tmp_path / "sweep_one.py"
    config.write_text("def get_config():\n    return {'base_config': 'tiny.py', 'beta': [0.1]}\n")
    name = sweep_mod.load_sweep(config).points[0].name
    run_dir = tmp_path / "out" / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "eval_after.json").write_text('{"test": {"accuracy": 0.5, "rew')  # cut short
    assert cli_main(["sweep", "--config", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert f"{run_dir / 'eval_after.json'} is not valid JSON" in _one_line_error(capsys, "sweep")


def test_damaged_checkpoints_set_aside_twice_are_both_kept(tmp_path):
    from kljax.train.checkpoint import RunCheckpointer

    ckpt = RunCheckpointer(tmp_path / "checkpoints")
    for content in ("first", "second"):
        (tmp_path / "checkpoints" / "5").mkdir()
        (tmp_path / "checkpoints" / "5" / "x").write_text(content)
        ckpt._set_aside([5])
    aside = tmp_path / "checkpoints.damaged"
    assert sorted((p.name, (p / "x").read_text()) for p in aside.iterdir()) == [("5", "first"), ("5.1", "second")]


def test_default_model_cache_entry_not_written_by_kljax_is_kept(tmp_path):
    from kljax.models.default import DEFAULT_MODEL_NAME, default_model_dir

    target = tmp_path / DEFAULT_MODEL_NAME
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="kljax does not delete it"):
        default_model_dir(tmp_path)
    assert (target / "mine.txt").read_text() == "keep me"


def test_new_run_refuses_a_workdir_holding_files_kljax_did_not_write(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"prompt": "my data"}\n')
    (tmp_path / "config.json").write_text('{"model_type": "llama"}\n')
    overrides = {**MESH, "steps": 1, "eval_examples": 8}
    config = load_run_config(("configs/tiny.py"), [f"--config.{k}={v}" for k, v in overrides.items()])
    with pytest.raises(UserError, match="holds config.json, samples.jsonl but no kljax run"):
        train(config, tmp_path, progress=False)
    assert (tmp_path / "samples.jsonl").read_text() == '{"prompt": "my data"}\n'
    assert (tmp_path / "config.json").read_text() == '{"model_type": "llama"}\n'


def test_the_export_command_a_finished_run_suggests_is_accepted(run1, tmp_path, monkeypatch, capsys):
    """`kljax train` ends with the commands to run next; its export line must not name an --out that
    export refuses (inside the run), for a relative workdir and for the working directory itself."""
    import shlex

    from kljax.train.run_outputs import output_lines

    for cwd, workdir in ((run1.parent, run1.name), (run1, ".")):
        monkeypatch.chdir(cwd)
        line = next(x for x in output_lines(Path(workdir)) if "kljax export " in x)  # the executable, then export
        argv = shlex.split(line.split("#")[0])[1:]
        assert cli_main(argv) == 0, capsys.readouterr().err
        out = Path(argv[argv.index("--out") + 1]).resolve()
        assert (out / "config.json").is_file() and out.parent == run1.parent
        shutil.rmtree(out)
