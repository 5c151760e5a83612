"""Trimming of a rendered CUDA file to the code its one point uses (render_kernel's last step).

The templates express the differences between points and variants in C++ -- ``if constexpr`` on
constants that Jinja renders (gg_kernel's, the vocabulary's GG_*, hopper's HP_*, a kernel's own)
-- and the shared headers hold the helpers of every family, so a rendered file carries the code
of every variant. ``trim`` removes, to a fixpoint, what the compiler would discard anyway:

1. An ``if`` statement (``constexpr`` or not) whose condition it can evaluate keeps only its
   live branch (branches.py), the values read off the file's own constexpr declarations
   (constants.py); a condition such as ``HP_STREAM_K && it < it_end`` is decided by its constant
   operand.
2. A conditional expression ``c ? x : y`` so decided becomes its live operand where its value is
   converted to a type the code names anyway (ternaries.py).
3. The statements after a ``return``, ``continue`` or ``break`` in their block go (unreachable.py).
4. A namespace-scope definition (function, struct, enum, typedef, constant) that nothing left in
   the file names goes, with the comment that heads it (unused.py).
5. A constexpr variable that nothing names goes (unused.py).
6. A struct's member function that nothing names goes, with the comment above it (unused.py).

None of this changes a cubin: a discarded branch, a dead operand, unreachable code and an unused
inline function or constant produce no code (benchmarks/cubins.py shows it for its 63 kernels).
Where a removal would change what a lambda captures, the code stays (the closure's layout can
move the compiler's output). The reader (cxx.py) knows tokens, brackets, statements and
namespace-scope declarations, not C++ at large: what it cannot read, it leaves.

Trimming a file takes about a tenth of a second (0.06 s for v4, 0.12 s for hopper_fp16, CPU time
measured on 2026-11-28), and tuners, dispatchers and tests render the same points in many processes, so a
result is kept in the cache folder (gemmgen.paths.cache_dir, ``trimmed/``) under the hash of the
source and of this package's code.
"""

import bisect
import hashlib
import os
import re
import tempfile
from functools import lru_cache
from pathlib import Path

from gemmgen.codegen.trim.branches import branch_edits
from gemmgen.codegen.trim.cxx import splice
from gemmgen.codegen.trim.ternaries import ternary_edits
from gemmgen.codegen.trim.unreachable import drop_unreachable
from gemmgen.codegen.trim.unused import drop_unused_constants, drop_unused_definitions, drop_unused_member_functions
from gemmgen.paths import cache_dir


@lru_cache(maxsize=1)
def _code_hash() -> bytes:
    """The trimmer's own code, part of a cached result's key (read at the first trim, not at import)."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).digest()


@lru_cache(maxsize=64)  # a tuner or a test renders a point more than once
def trim(source: str) -> str:
    """``source`` without the code the compiler would discard (see above), runs of blank lines
    made one. Read from the cache where an earlier process trimmed the same source; a cache that
    cannot be read or written costs only the time."""
    path = cache_dir() / "trimmed" / (hashlib.sha256(_code_hash() + source.encode()).hexdigest()[:40] + ".cu")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        pass
    trimmed = _trim(source)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        with os.fdopen(fd, "w") as f:
            f.write(trimmed)
        os.replace(tmp, path)  # whole or not at all: other processes may be reading it
    except OSError:
        pass
    return trimmed


def _trim(source: str) -> str:
    while True:
        before = source
        source = drop_unused_definitions(drop_unreachable(_fold(source)))
        while (dropped := drop_unused_member_functions(drop_unused_constants(source))) != source:  # a link a pass
            source = dropped
        if source == before:
            return re.sub(r"\n(?:[ \t]*\n){2,}", "\n\n", source)


def _fold(source: str) -> str:
    """Steps 1 and 2 to a fixpoint, each pass's edits of both spliced at once (one reading of the
    text serves both): a conditional expression inside a statement that a branch edit replaces
    waits for the next pass."""
    while True:
        edits = branch_edits(source)
        spans = sorted((a, b) for a, b, _ in edits)
        for edit in ternary_edits(source):
            k = bisect.bisect_right(spans, (edit[0], len(source)))
            if not (k and spans[k - 1][1] > edit[0] or k < len(spans) and spans[k][0] < edit[1]):
                edits.append(edit)
        if not edits:
            return source
        source = splice(source, edits)
