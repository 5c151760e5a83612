"""Where gemmgen's folders are: its data (inside an installed wheel, or at the top of a checkout)
and its cache."""

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"gemmgen's '{name}' folder is missing (looked in {_PACKAGE / '_data'} and {_PACKAGE.parent}); "
        "reinstall gemmgen"
    )


def templates_dir() -> Path:
    """The folder holding the Jinja CUDA templates."""
    return _data_dir("templates")


def search_spaces_dir() -> Path:
    """The folder holding the search-space TOML files, one per family."""
    return _data_dir("search_spaces")


def cache_dir() -> Path:
    """The cache of built kernels and trimmed sources: $GEMMGEN_CACHE, else ~/.cache/gemmgen
    (XDG_CACHE_HOME respected). Not created here."""
    if os.environ.get("GEMMGEN_CACHE"):
        return Path(os.environ["GEMMGEN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemmgen"
