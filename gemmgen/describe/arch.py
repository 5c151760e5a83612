"""GPU architectures gemmgen can target, and the per-architecture limits constraints check."""

import re
from dataclasses import dataclass

from gemmgen.errors import InvalidParameter


@dataclass(frozen=True)
class Arch:
    """A compute capability such as sm_90.

    ``max_smem_per_block`` is the opt-in dynamic shared-memory limit of one block, in bytes.
    """

    cc: int  # 90 for sm_90
    max_smem_per_block: int
    suffix: str = ""  # "a" for architecture-specific targets such as sm_90a

    @property
    def name(self) -> str:
        return f"sm_{self.cc}{self.suffix}"

    @property
    def nvcc_flags(self) -> list[str]:
        """nvcc's target flags. An "a" target is written with -gencode: nvcc 13.0's -arch=sm_90a
        shorthand also runs a plain sm_90 pass, which rejects wgmma and setmaxnreg."""
        if self.suffix:
            return [f"-gencode=arch=compute_{self.cc}{self.suffix},code=sm_{self.cc}{self.suffix}"]
        return [f"-arch=sm_{self.cc}"]


MAX_THREADS_PER_BLOCK = 1024
MAX_GRID_Y = 65535
# Above this many bytes a kernel must opt in to dynamic shared memory (cudaFuncSetAttribute).
DEFAULT_SMEM_LIMIT = 48 * 1024

_SMEM_LIMITS = {
    70: 96 * 1024,
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    120: 99 * 1024,
}

KNOWN_ARCHS = tuple(f"sm_{cc}" for cc in _SMEM_LIMITS)
# The CUDA releases whose nvcc builds for each compute capability: (first, last), None: still does.
NVCC_RELEASES = {
    70: ("9.0", "12.9"),
    75: ("10.0", None),
    80: ("11.0", None),
    86: ("11.1", None),
    87: ("11.4", None),
    89: ("11.8", None),
    90: ("11.8", None),
    100: ("12.8", None),
    120: ("12.8", None),
}
ARCH_SPECIFIC_FROM = 90  # architecture-specific ("a") targets exist from sm_90a on


def nvcc_needed(cc: int) -> str:
    """Which CUDA releases build for ``cc``, in words (for messages)."""
    first, last = NVCC_RELEASES[cc]
    return f"CUDA {first} to {last}" if last else f"CUDA {first} or newer"


def parse_arch(text: str | int) -> Arch:
    """Parse ``sm_89``, ``sm89``, ``89``, ``8.9`` or ``sm_90a`` into an Arch.

    Raises InvalidParameter naming the known architectures when the text is not one of them.
    """
    raw = str(text).strip().lower()
    m = re.fullmatch(r"(?:sm_?|compute_)?([0-9])\.?([0-9]{1,2})(a?)", raw)  # ASCII digits only
    if m:
        cc = int(m.group(1) + m.group(2))
        if cc in _SMEM_LIMITS:
            if m.group(3) and cc < ARCH_SPECIFIC_FROM:
                raise InvalidParameter(f"{text!r}: architecture-specific ('a') targets exist from "
                                       f"sm_{ARCH_SPECIFIC_FROM}a on; use sm_{cc}")
            return Arch(cc, _SMEM_LIMITS[cc], m.group(3))
    raise InvalidParameter(
        f"unknown GPU architecture {text!r}; allowed: {', '.join(KNOWN_ARCHS)} (e.g. --gpu sm_90)"
    )


def detect_arch() -> Arch | None:
    """The architecture of GPU 0 as nvidia-smi reports it, or None where there is no GPU."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False).stdout.split()
        return parse_arch(out[0]) if out else None
    except (OSError, subprocess.SubprocessError, InvalidParameter):
        return None
