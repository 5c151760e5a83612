"""Step 2: a conditional expression ``c ? x : y`` whose condition the file's constants decide
becomes its live operand, where that cannot change what the code means.

The value of ``c ? x : y`` has the operands' common type, which the live operand alone may not
have (``c ? 1 : 2.5f`` is a float), so an expression is folded only where its value is converted
to a type the code names anyway: the whole initializer of a variable declared with a type (not
``auto``, not a reference), the whole right side of an assignment, the whole operand of a
``return`` in a lambda with a declared return type (``-> int``), or a condition tested as bool
(the whole of a parenthesized operand of ``&&``, ``||`` or ``!``, or of an ``if``/``while``
condition); and anywhere where both operands are integer literals of one type (``r[X12 ? 2 :
1]``). A live operand of one token loses the parentheses that only group it. As for branches,
nothing is folded where the dead operand holds the only mention of a local a lambda captures.
"""

import re

from gemmgen.codegen.trim.branches import changes_captures
from gemmgen.codegen.trim.constants import Decided, decided_conditions
from gemmgen.codegen.trim.cxx import Shape, Unreadable, match, shape_of

_UNTYPED = {"auto", "decltype"}
_REFERENCE = {"&", "&&"}  # a reference would bind to the live operand itself, not to the value of c ? x : y
_STATEMENT_EDGE = {";", "{", "}"}
_LOOSER = {"(", "&&", "||", "=", "return", ",", "?", ":", ";", "{", "}"}  # before: none binds what follows more tightly
_ENDS = {"&&", "||", ")", ";", ",", "?", ":", "]", "}"}  # after: none binds what precedes more tightly


def ternary_edits(source: str) -> list[tuple[int, int, str]]:
    """The (start, end, text) edits that fold the outermost decided conditional expressions of
    ``source`` (those inside them wait for the next pass)."""
    shape = shape_of(source)
    at, end_of = shape.placed.start, shape.placed.end
    edits, taken_until = [], -1
    for decided in decided_conditions(shape, ternaries=True):
        if decided.first <= taken_until:
            continue  # inside one folded already: the next pass
        try:
            edit = _edit(shape, decided)
        except Unreadable:
            continue
        if edit is None:
            continue
        a, b, live = edit
        edits.append((at(a), end_of(b), source[at(live[0]):end_of(live[1])]))
        taken_until = b
    return edits


def _edit(shape: Shape, decided: Decided) -> tuple[int, int, tuple[int, int]] | None:
    """(first token, last token, (live operand's first, last)) of the replacement, or None where
    the expression stands where folding could change its meaning."""
    texts = shape.texts
    q, first = decided.index, decided.first
    colon, last = _operands(texts, q)
    live = (q + 1, colon - 1) if decided.live else (colon + 1, last)
    if live[0] > live[1] or not (_same_literal_type(texts, q, colon, last) or _typed_context(shape, first, last)):
        return None
    if changes_captures(shape, q, lambda: set(range(first, last + 1)) - set(range(live[0], live[1] + 1))):
        return None
    if live[0] == live[1] and _grouped(texts, first, last):
        first, last = first - 1, last + 1  # (c ? x : y) -> x
    return first, last, live


def _operands(texts: list[str], q: int) -> tuple[int, int]:
    """(the `:` of the conditional expression whose `?` is token q, its last token). Raises
    Unreadable where the third operand may end in a template's `>` (an unmatched `>` in it)."""
    colon, nested, angles, k = None, 0, 0, q + 1
    while k < len(texts):
        t = texts[k]
        if t in ("(", "[", "{"):
            k = match(texts, k) + 1
            continue
        if t == "<" and (after := _template_arguments_end(texts, k)) is not None:
            k = after
            continue
        if t in (")", "]", "}", ";", ","):
            break
        if t == "?":
            nested += 1
        elif t == ":":
            if nested:
                nested -= 1
            elif colon is None:
                colon = k
            else:
                break  # an outer conditional expression's
        elif colon is not None and t in ("<", ">", ">>"):
            angles += {"<": 1, ">": -1, ">>": -2}[t]
            if angles < 0:
                raise Unreadable
        k += 1
    if colon is None or k == colon + 1:
        raise Unreadable
    return colon, k - 1


def _same_literal_type(texts: list[str], q: int, colon: int, last: int) -> bool:
    """Whether both operands are one integer literal each, with the same suffix (of one type)."""
    x, y = texts[q + 1], texts[colon + 1]
    if colon != q + 2 or last != colon + 1 or not (x[0].isdigit() and y[0].isdigit()):
        return False
    ints = [re.fullmatch(r"(0[xX][0-9a-fA-F]+|[1-9][0-9]*|0)([uUlL]*)", t) for t in (x, y)]
    return all(ints) and ints[0][2].lower() == ints[1][2].lower() and all(int(m[1], 0) < 2**31 for m in ints)


def _template_arguments_end(texts: list[str], k: int) -> int | None:
    """The index after the template arguments that open at token k (`<` after a name, their `>`
    followed by a call's `(`, `::` or `{`), or None where the `<` reads as a comparison."""
    if k == 0 or not (texts[k - 1][0].isalpha() or texts[k - 1][0] == "_"):
        return None
    depth, j = 0, k
    while j < len(texts):
        t = texts[j]
        if t in ("(", "["):
            j = match(texts, j)
        elif t in (";", "{", "}", "?", ":", "&&", "||"):
            return None
        depth += {"<": 1, ">": -1, ">>": -2}.get(t, 0)
        j += 1
        if depth <= 0:
            return j if depth == 0 and j < len(texts) and texts[j] in ("(", "::", "{") else None
    return None


def _typed_context(shape: Shape, first: int, last: int) -> bool:
    """Whether the expression of tokens first .. last is converted to a type the code names, or
    tested as bool (see above)."""
    texts = shape.texts
    before, after = texts[first - 1], texts[last + 1] if last + 1 < len(texts) else ";"
    if before == "=" and after in (";", ","):
        k = first - 1
        depth = 0
        while k > 0 and not (depth == 0 and texts[k - 1] in _STATEMENT_EDGE):
            k -= 1
            depth += {")": 1, "]": 1, "(": -1, "[": -1}.get(texts[k], 0)
            if depth < 0:
                return False  # inside brackets: a default argument, say
        return not _UNTYPED.intersection(texts[k:first]) and not _REFERENCE.intersection(texts[k:first])
    if before == "return" and after == ";":
        for brace in shape.braces_around(first):
            intro = shape.lambda_introducer(brace)
            if intro is not None:
                words = texts[match(texts, intro) + 1:brace]
                returned = words[words.index("->"):] if "->" in words else ["auto"]
                return not _UNTYPED.intersection(returned) and not _REFERENCE.intersection(returned)
        return False
    return _bool_parens(texts, first, last)


def _bool_parens(texts: list[str], first: int, last: int) -> bool:
    """Whether tokens first .. last fill a pair of parentheses tested as bool: an operand of `&&`,
    `||` or `!` (nothing binding it more tightly on its other side), or an if or while condition."""
    if not _fills_parentheses(texts, first, last):
        return False
    before = texts[first - 2]
    after = texts[last + 2] if last + 2 < len(texts) else ";"
    return (before in ("if", "while", "!") or before in ("&&", "||") and after in _ENDS
            or after in ("&&", "||") and before in _LOOSER)


def _grouped(texts: list[str], first: int, last: int) -> bool:
    """Whether tokens first .. last fill a pair of parentheses that only group (not a call's, a
    cast's, an if's or a while's): what an operator or `return` precedes."""
    if not _fills_parentheses(texts, first, last):
        return False
    before = texts[first - 2]
    return before == "return" or not (before[0].isalnum() or before[0] == "_" or before in (")", "]", ">", ">>"))


def _fills_parentheses(texts: list[str], first: int, last: int) -> bool:
    """Whether tokens first .. last are all that a pair of parentheses holds (with a token before them)."""
    return first >= 2 and texts[first - 1] == "(" and last + 1 < len(texts) and texts[last + 1] == ")"
