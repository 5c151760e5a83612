"""Step 1: an ``if`` statement whose condition the file's constants decide becomes its live
branch, and a dead one without an else goes. ``if constexpr`` or not: a plain ``if`` on a constant
is as dead, and the compiler drops it too.

The live branch keeps its text and comments, moved left to the statement's indentation. A block
stands in the enclosing block without its braces where that changes no scope: none of its
statements declares anything, or the statement ends its block and nothing before it in its
function names what the block declares; otherwise it stays a block. Comments between the
condition and the branch stay, above it. A statement the reader cannot lay out this way (not
starting its line, say) is left as it is, and so is one inside a lambda whose captures its
removal would change (would_change_captures).
"""

import bisect

from gemmgen.codegen.trim.constants import Decided, decided_conditions
from gemmgen.codegen.trim.cxx import (
    INT_TYPES,
    SIZEOF,
    Placed,
    Shape,
    Unreadable,
    declarators,
    dedent,
    indent_at,
    line_end,
    line_start,
    match,
    read,
    rest_is_comment,
    shape_of,
    statement_end,
)


def branch_edits(source: str) -> list[tuple[int, int, str]]:
    """The (start, end, text) edits that replace the outermost decided ``if`` statements of
    ``source`` by their live branches (those inside them wait for the next pass)."""
    comments, shape = read(source).comments, shape_of(source)
    at = shape.placed.start
    edits, taken_until = [], -1
    for decided in decided_conditions(shape):
        if at(decided.index) < taken_until:
            continue  # inside one edited already: the next pass
        try:
            edit = None if would_change_captures(shape, decided) else _edit(source, comments, shape, decided)
        except Unreadable:
            continue
        if edit is not None:
            edits.append(edit)
            taken_until = edit[1]
    return edits


def _parts(shape: Shape, decided: Decided) -> tuple[int, tuple[int, int] | None, int]:
    """(the condition's `)`, the live branch's first and last token or None, the statement's last
    token) of the statement at decided."""
    texts, kinds, i = shape.texts, shape.kinds, decided.index
    paren = i + 2 if texts[i + 1] == "constexpr" else i + 1
    close = match(texts, paren)
    if ";" in texts[paren + 1:close]:
        raise Unreadable  # an init-statement: the templates write none
    then_end = statement_end(texts, kinds, close + 1)
    has_else = then_end + 1 < len(texts) and texts[then_end + 1] == "else"
    last = statement_end(texts, kinds, then_end + 2) if has_else else then_end
    live = (close + 1, then_end) if decided.live else (then_end + 2, last) if has_else else None
    return close, live, last


def would_change_captures(shape: Shape, decided: Decided) -> bool:
    """Whether removing the dead parts of the statement at decided changes what a lambda around it
    captures. A lambda with a capture-default captures the locals of its function that it names,
    discarded statements included, and its closure's layout follows them -- which can move the
    compiler's output. A name counts as such a local where the function declares it before the
    lambda (a constexpr scalar excepted: naming one is no odr-use); the lambda keeps capturing it
    where it names it elsewhere too."""
    def removed() -> set[int]:
        _, live, last = _parts(shape, decided)
        return set(range(decided.index, last + 1)) - (set(range(live[0], live[1] + 1)) if live else set())

    return changes_captures(shape, decided.index, removed)


def changes_captures(shape: Shape, at: int, removed) -> bool:
    """Whether removing the tokens removed() (indices; asked for only where token `at`, among
    them, lies in a lambda with a capture-default) changes what a lambda around it captures (see
    would_change_captures)."""
    texts, kinds = shape.texts, shape.kinds
    gone = None  # worked out at the first such lambda: most statements lie in none
    for brace in shape.braces_around(at):
        intro = shape.lambda_introducer(brace)
        if intro is None or texts[intro + 1] not in ("&", "=") or texts[intro + 2] not in (",", "]"):
            continue
        if gone is None:
            gone = removed()
            names = {texts[n] for n in gone if kinds[n] == "id" and texts[n - 1] not in (".", "->", "::")}
            start = shape.start(at)
        locals_before = _locals(shape, start, intro)
        named_elsewhere = {texts[n] for n in range(intro, match(texts, brace) + 1)
                           if n not in gone and kinds[n] == "id"}
        if any(name in locals_before and name not in named_elsewhere for name in names):
            return True
    return False


def _locals(shape: Shape, a: int, b: int) -> set[str]:
    """Names that tokens [a, b) may declare as variables or parameters, but constexpr scalars and
    type aliases (``using X = ...``: a type is never captured)."""
    texts, kinds = shape.texts, shape.kinds
    constants = set()  # indexes of the declarators of constexpr scalars
    for n in range(a, b):
        if texts[n] == "constexpr" and texts[n - 1] != "if":
            try:
                found = declarators(texts, kinds, n) or []
            except Unreadable:
                found = []
            if found and set(texts[n + 1:found[0][0]]) <= INT_TYPES | {"static", "const", "auto"}:
                constants.update(d[0] for d in found)
    return {texts[n] for n in shape.declared_in(a, b) if n not in constants and texts[n - 1] != "using"}


_STATEMENT_WORDS = {"if", "for", "while", "do", "switch", "return", "break", "continue", "{", "asm", "++", "--", "*",
                    "("}
_DECLARING_WORDS = {"const", "constexpr", "static", "auto", "using", "typedef", "case", "default", "struct", "class",
                    "enum", "thread_local", "extern", "register", "volatile"} | INT_TYPES | set(SIZEOF)
_AFTER_AN_EXPRESSION_START = {"(", "=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", ".", "->", "[",
                              "++", "--"}


def _declares_nothing(shape: Shape, i: int, end: int) -> bool:
    """Whether no statement directly inside the block of tokens i .. end (its braces) declares a
    name: each is a control statement, a block, or an expression (a call, an assignment)."""
    texts, kinds = shape.texts, shape.kinds
    j = i + 1
    while j < end:
        if kinds[j] == "pp":
            j += 1
            continue
        if texts[j] in _STATEMENT_WORDS:
            pass
        elif kinds[j] == "id" and texts[j] not in _DECLARING_WORDS:
            k = j + 1
            while k + 1 < end and texts[k] == "::":
                k += 2
            if texts[k] == "<":  # template arguments: a call follows them, or a declarator
                depth = 0
                while k < end:
                    depth += {"<": 1, ">": -1, ">>": -2}.get(texts[k], 0)
                    if texts[k] == ";":
                        return False
                    k += 1
                    if depth <= 0:
                        break
                if texts[k] != "(":
                    return False
            elif texts[k] not in _AFTER_AN_EXPRESSION_START or texts[k - 1] == "::" and texts[k] != "(":
                return False
        else:
            return False
        j = statement_end(texts, kinds, j) + 1
    return True


def _ends_block_unclashing(shape: Shape, i: int, last: int, b0: int, b1: int) -> bool:
    """Whether the statement of tokens i .. last ends its block and nothing before it in its
    function names what its branch, tokens b0 .. b1, declares: then the branch's statements can
    stand in the enclosing block, their names living to its end (where they die anyway)."""
    texts, kinds = shape.texts, shape.kinds
    if last + 1 >= len(texts) or texts[last + 1] != "}":
        return False
    declared = {texts[n] for n in shape.declared_in(b0 + 1, b1)}
    return not any(kinds[n] == "id" and texts[n] in declared for n in range(shape.start(i), i))


def _comments_between(comments: Placed, a: int, b: int) -> list[str]:
    """The comments (a file's) that lie within [a, b)."""
    every = range(len(comments.texts))
    first, last = bisect.bisect_left(every, a, key=comments.start), bisect.bisect_right(every, b, key=comments.end)
    return comments.texts[first:last]


def _edit(source: str, comments: Placed, shape: Shape, decided: Decided) -> tuple[int, int, str] | None:
    """(start, end, text): the replacement of the statement at decided by its live branch, or None
    where it cannot be laid out cleanly."""
    texts, kinds, i, at, end_of = shape.texts, shape.kinds, decided.index, shape.placed.start, shape.placed.end
    close, live, last = _parts(shape, decided)
    then_end = statement_end(texts, kinds, close + 1)
    s_start, s_end = at(i), end_of(last)
    heads_from = None if live is None else end_of(close) if decided.live else end_of(then_end + 1)
    if i > 0 and texts[i - 1] == "else":
        return _else_edit(source, comments, shape, i, live, heads_from, s_end)
    j = i - 1
    while j >= 0 and kinds[j] == "pp":
        j -= 1
    in_block = j < 0 or texts[j] in ("{", ";", "}")  # not the substatement of a loop or an if
    ls = line_start(source, s_start)
    if source[ls:s_start].strip() or not rest_is_comment(source, s_end):
        return None
    c0 = s_start - ls
    ind = " " * c0
    end = min(len(source), line_end(source, s_end) + 1)
    if live is None:
        return (ls, end, "") if in_block else None
    b0, b1 = live
    lines = [ind + c for c in _comments_between(comments, heads_from, at(b0))]
    last_part = end_of(b1) == s_end
    if texts[b0] == "{":
        open_end = line_end(source, end_of(b0))
        close_ls = line_start(source, at(b1))
        after_open = source[end_of(b0):open_end].strip()
        if (after_open and not after_open.startswith("//")) or source[close_ls:at(b1)].strip():
            return None
        inner = source[open_end + 1:close_ls].split("\n")[:-1] if close_ls > open_end else []
        after_close = source[end_of(b1):line_end(source, end_of(b1))].rstrip() if last_part else ""
        if in_block and (_declares_nothing(shape, b0, b1) or _ends_block_unclashing(shape, i, last, b0, b1)):
            firsts = [ln for ln in inner if ln.strip() and not ln.startswith("#")]
            by = max(0, len(firsts[0]) - len(firsts[0].lstrip(" ")) - c0) if firsts else 0
            lines += [ind + after_open] if after_open else []
            lines += dedent(inner, by)
            lines += [ind + after_close.strip()] if after_close.strip() else []
        else:
            lines += [ind + "{" + (" " + after_open if after_open else "")]
            lines += dedent(inner, max(0, indent_at(source, at(b1)) - c0))
            lines += [ind + "}" + after_close]
    else:
        k = b0
        while kinds[k] == "pp":
            k += 1
        b_end = line_end(source, end_of(b1)) if last_part or rest_is_comment(source, end_of(b1)) else end_of(b1)
        first_ls = line_start(source, at(b0))
        block = source[first_ls:b_end].split("\n")
        by = max(0, indent_at(source, at(k)) - c0)
        if source[first_ls:at(b0)].strip():  # it starts on the line of the `if` or an `else`
            block[0] = " " * (c0 + by) + source[at(b0):line_end(source, at(b0))]
        lines += dedent(block, by)
    return ls, end, "".join(line.rstrip() + "\n" for line in lines)


def _else_edit(source: str, comments: Placed, shape: Shape, i: int, live, heads_from,
               s_end: int) -> tuple[int, int, str] | None:
    """The edit of an `else if` statement (token i is its `if`): `else` and the live
    branch, or nothing."""
    texts, kinds, at, end_of = shape.texts, shape.kinds, shape.placed.start, shape.placed.end
    else_start, else_end, before_end = at(i - 1), end_of(i - 1), end_of(i - 2)
    if live is None:
        a = else_start if _comments_between(comments, before_end, else_start) else before_end
        return a, s_end, ""
    b0, b1 = live
    heads = _comments_between(comments, heads_from, at(b0))
    e_ind = indent_at(source, else_start)
    if kinds[b0] == "pp":
        return None
    block = source[at(b0):end_of(b1)].split("\n")
    if texts[b0] == "{":
        if heads:
            return None
        by = max(0, indent_at(source, at(b1)) - e_ind)
        return else_end, s_end, " " + "\n".join(block[:1] + dedent(block[1:], by))
    by = max(0, at(b0) - line_start(source, at(b0)) - (e_ind + 4))
    text = ("".join(" " + c for c in heads) + "\n" + " " * (e_ind + 4)
            + "\n".join(block[:1] + dedent(block[1:], by)))
    return else_end, s_end, text
