"""matplotlib for `gemmgen plot`: loading it (Agg, no display needed), the house style, and
writing a figure to a PNG or SVG file."""

import contextlib
from pathlib import Path

from gemmgen.errors import GemmgenError, InvalidParameter

FORMATS = {".png": "png", ".svg": "svg"}
INSTALL = "pip install 'gemmgen[plot]'"
# Text stays text in SVG (searchable, and what the tests read); ids and metadata do not change
# from run to run, so a picture made again from the same data is the same file.
STYLE = {
    "svg.fonttype": "none",
    "svg.hashsalt": "gemmgen",
    "font.size": 10,
    "axes.grid": True,
    "grid.color": "0.85",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "savefig.dpi": 150,
}
_METADATA = {"png": {"Software": None}, "svg": {"Date": None, "Creator": None}}


def check_output(path: str) -> str:
    """The format ("png" or "svg") ``path``'s suffix names; raises InvalidParameter for any
    other suffix."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InvalidParameter(f"-o {path}: the picture is written as PNG or SVG; name a file ending in "
                               f"{' or '.join(FORMATS)}")
    return fmt


def load_pyplot():
    """matplotlib.pyplot on the Agg backend. Raises GemmgenError naming the extra to install
    where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise GemmgenError(f"gemmgen plot needs matplotlib, which is not installed: {INSTALL}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


@contextlib.contextmanager
def style(pyplot):
    """STYLE in effect for the figures drawn and saved inside."""
    with pyplot.rc_context(STYLE):
        yield


def save(pyplot, figure, path: str, fmt: str) -> None:
    """Writes ``figure`` to ``path`` as ``fmt`` and closes it. Raises GemmgenError where the file
    cannot be written."""
    try:
        figure.savefig(path, format=fmt, bbox_inches="tight", metadata=_METADATA[fmt])
    except OSError as err:
        raise GemmgenError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        pyplot.close(figure)
