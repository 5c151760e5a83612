"""Step 3: code after a jump goes. In a block, the statements that follow a ``return``,
``continue`` or ``break`` -- or a bare block ``{ ...; continue; }`` whose last statement is such
a jump -- up to the block's end never run, unless a label (``case``, ``default``, a goto target)
leads there or a conditional-compilation directive lies among them; then they stay. Folding
leaves such code: ``if constexpr (HP_SWAP) { ...; continue; }`` keeps its branch, and the other
variants' code after it is dead. As for branches, it stays where it holds the only mention of a
local that a lambda around it captures.
"""

import re

from gemmgen.codegen.trim.branches import changes_captures
from gemmgen.codegen.trim.cxx import (
    Shape,
    Unreadable,
    brace_kind,
    indices,
    line_end,
    line_start,
    match,
    rest_is_comment,
    shape_of,
    splice,
    statement_end,
)

_JUMPS = ("return", "continue", "break")


def drop_unreachable(source: str) -> str:
    """``source`` without the statements that follow a jump in their block (see above)."""
    shape = shape_of(source)
    blocks = set()  # those a jump may end early: the jump's, and the one around a bare block it ends
    for word in _JUMPS:
        for jump in indices(shape.texts, word):
            blocks.add(parent := shape.parent(jump))
            blocks.add(shape.parent(parent))
    edits, taken_until = [], -1
    for brace in sorted(blocks - {-1}):
        if brace < taken_until or brace_kind(shape.texts, shape.kinds, brace)[0] != "block":
            continue
        try:
            edit = _edit(source, shape, brace)
        except Unreadable:
            continue
        if edit is not None:
            edits.append(edit[:3])
            taken_until = edit[3]
    return splice(source, edits) if edits else source


def _edit(source: str, shape: Shape, brace: int) -> tuple[int, int, str, int] | None:
    """(start, end, "", the block's `}`): the removal of the dead statements of the block that
    opens at token brace, or None where it has none or they do not lie on lines of their own."""
    texts, kinds, at, end_of = shape.texts, shape.kinds, shape.placed.start, shape.placed.end
    close = match(texts, brace)
    j = brace + 1
    while j < close:
        end = statement_end(texts, kinds, j)
        if _always_jumps(texts, kinds, _first(kinds, j), end) and end + 1 < close:
            if any(kinds[n] == "pp" and re.match(r"#\s*(if|el|endif)", texts[n]) for n in range(end + 1, close)):
                return None  # conditional compilation: the jump may not be there, or the #endif must stay
            k = end + 1
            while k < close:
                if _labeled(texts, kinds, _first(kinds, k)):
                    return None
                k = statement_end(texts, kinds, k) + 1
            a, b = line_end(source, end_of(end)) + 1, line_start(source, at(close))
            if not rest_is_comment(source, end_of(end)) or source[b:at(close)].strip() or a > b:
                return None
            if changes_captures(shape, end + 1, lambda dead=range(end + 1, close): set(dead)):
                return None
            return a, b, "", close
        j = end + 1
    return None


def _first(kinds: list[str], j: int) -> int:
    """The first token of the statement at j that is not a directive (a #pragma before it)."""
    while kinds[j] == "pp":
        j += 1
    return j


def _always_jumps(texts: list[str], kinds: list[str], i: int, end: int) -> bool:
    """Whether the statement of tokens i .. end leaves its block every time: a jump, or a bare
    block whose last statement always jumps."""
    if texts[i] in _JUMPS:
        return True
    if texts[i] != "{":
        return False
    last, j = None, i + 1
    while j < end:
        last = j
        j = statement_end(texts, kinds, j) + 1
    return last is not None and _always_jumps(texts, kinds, _first(kinds, last), statement_end(texts, kinds, last))


def _labeled(texts: list[str], kinds: list[str], i: int) -> bool:
    return texts[i] in ("case", "default") or kinds[i] == "id" and i + 1 < len(texts) and texts[i + 1] == ":"
