"""The persistent XLA cache: under KLJAX_CACHE/xla unless KLJAX_XLA_CACHE=0, a directory JAX already
has kept, any other value refused with one named line."""

import jax
import pytest

from kljax.errors import UserError
from kljax.train.run_build import enable_compilation_cache


@pytest.fixture
def no_cache_dir(monkeypatch, tmp_path):
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("KLJAX_CACHE", str(tmp_path))
    yield tmp_path
    jax.config.update("jax_compilation_cache_dir", before)


@pytest.mark.parametrize("value", [None, "1"])
def test_compilations_persist_under_kljax_cache(monkeypatch, no_cache_dir, value):
    if value is None:
        monkeypatch.delenv("KLJAX_XLA_CACHE", raising=False)
    else:
        monkeypatch.setenv("KLJAX_XLA_CACHE", value)
    enable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(no_cache_dir / "xla")


def test_zero_turns_the_cache_off(monkeypatch, no_cache_dir):
    monkeypatch.setenv("KLJAX_XLA_CACHE", "0")
    enable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir is None


def test_a_cache_directory_jax_has_is_kept(monkeypatch, no_cache_dir):
    jax.config.update("jax_compilation_cache_dir", str(no_cache_dir / "mine"))
    enable_compilation_cache()
    assert jax.config.jax_compilation_cache_dir == str(no_cache_dir / "mine")


def test_another_value_is_one_named_line(monkeypatch, no_cache_dir):
    monkeypatch.setenv("KLJAX_XLA_CACHE", "yes")
    with pytest.raises(UserError, match=r"KLJAX_XLA_CACHE='yes': expected 1 .* or 0"):
        enable_compilation_cache()
