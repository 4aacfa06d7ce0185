"""`kljax convert` on a tiny random model: --check, HF -> orbax -> HF round trip."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kljax.cli import main  # noqa: E402
from kljax.models.tiny import save_tiny_hf_model  # noqa: E402
from kljax.studies.parity import transformers_logits  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_hf_model("llama3", tmp_path_factory.mktemp("llama3"))


def test_check_prints_max_abs_diff_last_and_exits_zero(llama_dir, capsys):
    assert main(["convert", "--check", "--model", str(llama_dir)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("max_abs_diff=")
    assert float(lines[-1].split("=")[1]) < 1e-4


def test_check_exits_nonzero_above_tolerance(llama_dir, capsys):
    # float32 JAX against float32 torch differ by ~1e-6, so 1e-12 is exceeded
    assert main(["convert", "--check", "--model", str(llama_dir), "--tolerance=1e-12"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("max_abs_diff=")


def test_negative_tolerance_is_refused_in_one_line(llama_dir, capsys):
    assert main(["convert", "--check", "--model", str(llama_dir), "--tolerance=-1"]) == 2
    assert "--tolerance=-1 must be a finite number >= 0" in capsys.readouterr().err


def test_convert_to_orbax_and_export_back_loads_in_transformers(llama_dir, tmp_path, capsys):
    assert main(["convert", "--model", str(llama_dir), "--out", str(tmp_path / "kl")]) == 0
    assert (tmp_path / "kl" / "params").is_dir()
    assert main(["convert", "--export", "--model", str(tmp_path / "kl"), "--out", str(tmp_path / "hf")]) == 0
    original = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    tokens = np.arange(1, 11, dtype=np.int32)[None]
    mask = np.ones_like(tokens, bool)
    np.testing.assert_array_equal(
        transformers_logits(exported, tokens, mask), transformers_logits(original, tokens, mask)
    )
