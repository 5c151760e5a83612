"""gemmgen.paths: where the cache is (the data folders are checked by CI's installed-package step
and every test that renders)."""

from gemmgen.paths import cache_dir


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("GEMMGEN_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "gemmgen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "gemmgen"
