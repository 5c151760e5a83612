"""Steps 4 and 5: what nothing names goes.

Step 4 reads the file's namespace-scope declarations (anonymous namespaces opened) and keeps
those reachable, by the names their tokens hold, from the roots: kernels, ``extern "C"``
functions, directives, and whatever it cannot tell is droppable -- a function defined neither
inline, as a template nor internal, a variable not constexpr, a declaration it cannot read.
Overloads, specializations and forward declarations share their name, so they go together. A
comment block heads the run of declarations right below it; one followed by a blank line heads,
where it holds a section heading (``// ---- title ----``, the templates' convention), the
declarations up to the next heading. It goes when all it heads go. An anonymous namespace left
empty goes too.

Step 5 drops constexpr variables at any scope that nothing else names (a struct member: inside
its struct, as S::X, or after `.` or `->`), whole declarations or single declarators.

Step 6 drops a struct's member functions that nothing else names (as in step 5), with the
comment lines right above one. Constructors, destructors, operators and virtual functions stay,
and so do data members: removing one could shift a brace initializer's fields.
"""

import bisect
import itertools
import re
from dataclasses import dataclass

from gemmgen.codegen.trim.cxx import (
    Placed,
    Shape,
    Unreadable,
    brace_kind,
    declarators,
    directive_names,
    indices,
    line_end,
    line_start,
    match,
    rest_is_comment,
    shape_of,
    skip_angles,
    splice,
)

_ATTRIBUTE_CALLS = {"__align__", "__launch_bounds__", "__cluster_dims__", "alignas", "__attribute__", "__declspec"}
_INLINE = {"inline", "__forceinline__", "__inline__", "constexpr", "static"}
_NOT_PLAIN = {"virtual", "override", "operator", "~", "friend", "using", "typedef"}  # members step 6 leaves
_HEADING = re.compile(r"\s*// ----.*----\s*$")  # the templates' section headings


@dataclass
class _Item:
    first: int  # its first and last token
    last: int
    names: tuple = ()
    root: bool = True
    kind: str = "decl"  # decl | pp | ns_open | ns_close (an anonymous namespace's braces)
    live: bool = False


def drop_unused_definitions(source: str) -> str:
    shape = shape_of(source)
    texts = shape.texts
    try:
        items = _items(shape)
    except Unreadable:
        return source
    by_name: dict[str, list[_Item]] = {}
    for item in items:
        for name in item.names:
            by_name.setdefault(name, []).append(item)
    directives = indices(shape.kinds, "pp")
    todo, seen = [item for item in items if item.root], set()
    while todo:
        item = todo.pop()
        if item.live:
            continue
        item.live = True
        names = set(texts[item.first:item.last + 1])  # an identifier's text is no other token's
        for n in directives[bisect.bisect_left(directives, item.first):bisect.bisect_right(directives, item.last)]:
            names.update(directive_names(texts[n]))
        for name in names - seen:
            todo += by_name.get(name, [])
        seen |= names
    opened = []
    for n, item in enumerate(items):
        if item.kind == "ns_open":
            opened.append(n)
        elif item.kind == "ns_close" and opened:
            first = opened.pop()
            if not any(x.live for x in items[first + 1:n] if x.kind in ("decl", "pp")):
                items[first].live = items[n].live = False
    return _cut(source, shape.placed, items)


class _Macros:
    """A file's object-like macros (GG_DEVICE -> __device__ __forceinline__), for reading the words
    of a declaration as the compiler does."""

    def __init__(self, shape: Shape):
        self.words: dict[str, list[str]] = {}
        for n in indices(shape.kinds, "pp"):
            m = re.match(r"#\s*define\s+(\w+)(?!\()\s+(.*)", shape.texts[n])
            if m:
                self.words[m[1]] = m[2].split()
        self.extra = {name: len(words) - 1 for name, words in self.words.items()}  # words more than tokens
        # the tokens whose words hold __global__
        self.global_ = {name for name, words in self.words.items() if "__global__" in words}
        self.global_ |= {"__global__"} - self.words.keys()

    def expanded(self, texts: list[str], i: int, j: int):
        """The words of the tokens texts[i] .. texts[j], one at a time."""
        for n in range(i, j + 1):
            yield from self.words.get(texts[n], (texts[n],))


def _items(shape: Shape) -> list[_Item]:
    """The namespace-scope declarations of the code, in order."""
    texts, kinds = shape.texts, shape.kinds
    macros = _Macros(shape)
    items, opened, i = [], 0, 0
    while i < len(texts):
        if kinds[i] == "pp":
            items.append(_Item(i, i, kind="pp"))
            i += 1
        elif texts[i] == "namespace" and i + 1 < len(texts) and texts[i + 1] == "{":
            items.append(_Item(i, i + 1, kind="ns_open"))
            opened += 1
            i += 2
        elif texts[i] == "}" and opened:
            items.append(_Item(i, i, kind="ns_close"))
            opened -= 1
            i += 1
        else:
            j = _declaration_end(texts, i)
            items.append(_classify(shape, i, j, bool(opened), macros))
            i = j + 1
    return items


def _declaration_end(texts: list[str], i: int) -> int:
    """Index of the last token of the namespace-scope declaration from token i: its `;`, or the
    `}` of a function's body."""
    j, initialized = skip_angles(texts, i + 1) if texts[i] == "template" else i, False
    k = j
    while True:
        x = texts[j]
        if x in ("(", "["):
            j = match(texts, j)
        elif x == "=":
            initialized = True
        elif x == "{":
            j = match(texts, j)
            if j + 1 < len(texts) and texts[j + 1] == ";":
                return j + 1
            if not (initialized or texts[k] in ("struct", "class", "union", "enum", "typedef")):
                return j
        elif x == ";":
            return j
        j += 1


def _classify(shape: Shape, i: int, j: int, in_anonymous: bool, macros: _Macros) -> _Item:
    """The item of the declaration of tokens i .. j: the names it declares, and whether it is
    a root. Its words are its tokens with the macros expanded."""
    texts, kinds = shape.texts, shape.kinds
    tt, tk = texts[i:j + 1], kinds[i:j + 1]  # its tokens
    root = _Item(i, j)
    k, templated = 0, False
    if tt[0] == "template":
        k = skip_angles(texts, i + 1) - i
        templated = k > 3  # template <...> with parameters, not an explicit specialization
    while k + 1 < len(tt) and tt[k] == "[" and tt[k + 1] == "[":
        k = match(texts, i + k) - i + 1
    if k >= len(tt) or not macros.global_.isdisjoint(tt):  # __global__ among its words
        return root
    first = tt[k]
    if first == "extern" and k + 1 < len(tt) and tk[k + 1] == "str":
        return root
    if first == "namespace" and k + 1 < len(tt) and tk[k + 1] == "id":
        return _Item(i, j, names=(tt[k + 1],), root=False)
    if first in ("struct", "class", "union", "enum"):
        m = k + 1
        while m < len(tt) and (tt[m] in _ATTRIBUTE_CALLS or tt[m] in ("class", "struct")):
            m = match(texts, i + m + 1) - i + 1 if tt[m] in _ATTRIBUTE_CALLS else m + 1
        if m >= len(tt) or tk[m] != "id":
            return root
        names = [tt[m]]
        brace = next((n for n in range(m, len(tt)) if tt[n] == "{"), None)
        if first == "enum" and brace is not None:  # its enumerators too
            body_end = match(texts, i + brace) - i
            body, body_kinds = tt[brace + 1:body_end], tk[brace + 1:body_end]
            names += [body[n] for n in range(len(body)) if body_kinds[n] == "id" and (n == 0 or body[n - 1] == ",")]
        return _Item(i, j, names=tuple(names), root=False)
    if first == "typedef":
        if "(" in tt and "{" not in tt:
            return root  # a function type
        depth, last_id = 0, None
        for text, kind in zip(tt, tk):
            depth += {"{": 1, "}": -1}.get(text, 0)
            if depth == 0 and kind == "id":
                last_id = text
        return _Item(i, j, names=(last_id,), root=False) if last_id else root
    if first == "using":
        if k + 2 < len(tt) and tk[k + 1] == "id" and tt[k + 2] == "=":
            return _Item(i, j, names=(tt[k + 1],), root=False)
        return root
    m = k  # a function or variables: the first `(`, `=`, `[`, `;` or `{` past attributes
    while m < len(tt) and tt[m] not in ("(", "=", "[", ";", "{"):
        m += 1
        if tt[m - 1] in _ATTRIBUTE_CALLS and m < len(tt) and tt[m] == "(":
            m = match(texts, i + m) - i + 1
    if m >= len(tt):
        return root
    n = m - 1
    if tt[m] == "(" and n > k and tt[n] == ">":  # an explicit specialization: f<args>(
        depth = 0
        while n > k:
            depth += {">": 1, ">>": 2, "<": -1}.get(tt[n], 0)
            n -= 1
            if depth == 0:
                break
    if n < k or tk[n] != "id" or "operator" in tt[k:m]:
        return root
    if tt[m] == "(":  # droppable: inline, internal, a template, or a declaration only
        head = itertools.takewhile(lambda w: w != "(", macros.expanded(texts, i, j))  # the words before the first (
        droppable = in_anonymous or templated or bool(_INLINE & set(head)) or tt[-1] == ";"
        return _Item(i, j, names=(tt[n],), root=not droppable)
    count = m + sum(map(macros.extra.get, tt, itertools.repeat(0)))  # m + len(words) - len(tt)
    if count >= 0:
        head = set(itertools.islice(macros.expanded(texts, i, j), count))
    else:
        head = set(list(macros.expanded(texts, i, j))[:count])
    droppable = ("constexpr" in head or "extern" in head and tt[m] != "=") and not (
        head & {"__device__", "__constant__", "__managed__"})  # those define device symbols
    depth, names = 0, [tt[n]]
    for p in range(m, len(tt)):  # `constexpr int A = 1, B = 2;` declares both
        depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(tt[p], 0)
        if depth == 0 and tt[p] == "," and p + 1 < len(tt) and tk[p + 1] == "id":
            names.append(tt[p + 1])
    return _Item(i, j, names=tuple(names), root=not droppable)


def _cut(source: str, placed: Placed, items: list[_Item]) -> str:
    """``source`` without the lines of the items that are not live and of the comments that head
    only such items (see the module's docstring). An item sharing a line with another stays."""
    lines = source.split("\n")
    starts = [0, *itertools.accumulate(map((1).__add__, map(len, lines[:-1])))]  # of each line

    def line_of(pos: int) -> int:
        return bisect.bisect_right(starts, pos) - 1

    at, texts = placed.all_starts(), placed.texts
    span = [(line_of(at[it.first]), line_of(at[it.last] + len(texts[it.last]) - 1)) for it in items]
    owner: dict[int, int] = {}
    for n, (a, b) in enumerate(span):
        for line in range(a, b + 1):
            owner.setdefault(line, n)
    dead_lines: set[int] = set()
    for n, item in enumerate(items):
        a, b = span[n]
        if (item.live or source[starts[a]:at[item.first]].strip()
                or not rest_is_comment(source, at[item.last] + len(texts[item.last]))
                or any(items[owner[line]].live for line in range(a, b + 1) if owner[line] != n)):
            continue
        dead_lines.update(range(a, b + 1))

    def is_comment(line: int) -> bool:
        return line not in owner and lines[line].strip().startswith("//")

    line = 0
    while line < len(lines):
        if not is_comment(line):
            line += 1
            continue
        top = line
        while line < len(lines) and is_comment(line):
            line += 1
        run = []
        if line in owner:  # the run of items from here, each on the line after the last
            run = [owner[line]]
            while run[-1] + 1 < len(items) and span[run[-1] + 1][0] <= span[run[-1]][1] + 1:
                run.append(run[-1] + 1)
        elif any(_HEADING.match(lines[n]) for n in range(top, line)):  # the items up to the next heading
            for n in range(len(items)):
                if span[n][0] <= line:
                    continue
                gap = range(span[run[-1]][1] + 1 if run else line, span[n][0])
                if items[n].kind in ("ns_open", "ns_close") or any(is_comment(g) and _HEADING.match(lines[g])
                                                                    for g in gap):
                    break
                run.append(n)
        decls = [n for n in run if items[n].kind in ("decl", "pp")]
        if decls and all(span[n][0] in dead_lines for n in decls):
            dead_lines.update(range(top, line))
    edits = []  # each run of dead lines with the newline after it (before it, where it ends the file)
    for line in sorted(dead_lines):
        start = edits.pop()[0] if edits and edits[-1][1] == starts[line] else starts[line]
        edits.append((start, starts[line + 1] if line + 1 < len(lines) else len(source), ""))
    if len(lines) - 1 in dead_lines and edits[-1][0] > 0:  # the last run ends the file
        edits[-1] = (edits[-1][0] - 1, len(source), "")
    return splice(source, edits)


def drop_unused_constants(source: str) -> str:
    shape = shape_of(source)
    texts, kinds, at, end_of = shape.texts, shape.kinds, shape.placed.start, shape.placed.end
    edits, struct_ends = [], {}
    for i in indices(shape.texts, "constexpr"):
        if texts[i - 1] == "if":
            continue
        start = i  # the declaration's first token
        while start > 0 and texts[start - 1] in ("static", "inline", "[", "]", "maybe_unused"):
            start -= 1
        if start > 0 and texts[start - 1] not in (";", "{", "}", ":") and kinds[start - 1] != "pp":
            continue
        try:
            found = declarators(texts, kinds, i)
        except Unreadable:
            continue
        if not found:
            continue
        brace = shape.parent(i)
        kind, struct = brace_kind(texts, kinds, brace) if brace >= 0 else ("block", None)
        if kind == "struct" and struct:
            if brace not in struct_ends:
                struct_ends[brace] = match(texts, brace)
            unused = [d for d in found if not _member_named(shape, brace, struct_ends[brace], struct, d[0])]
        else:
            unused = [d for d in found if shape.uses[texts[d[0]]] == 1]
        if len(unused) == len(found):
            a, b = at(start), end_of(found[-1][1] + 1)
            ls = line_start(source, a)
            if not source[ls:a].strip() and rest_is_comment(source, b):
                a, b = _lines_with_comment(source, ls, b)
            edits.append((a, b, ""))
        elif unused:  # the others, each after the separator that came before it
            kept = [d for d in found if d not in unused]
            text = source[at(kept[0][0]):end_of(kept[0][1])]
            for d in kept[1:]:
                before = found[found.index(d) - 1]
                text += source[end_of(before[1]):at(d[0])] + source[at(d[0]):end_of(d[1])]
            edits.append((at(found[0][0]), end_of(found[-1][1]), text))
    return splice(source, edits)


def _member_named(shape: Shape, brace: int, end: int, struct: str, n: int) -> bool:
    """Whether the member declared at token n of the struct whose body is tokens brace .. end is
    named elsewhere: inside the struct, as struct::name, or after `.` or `->`."""
    texts = shape.texts
    name = texts[n]
    if shape.uses[name] == 1:
        return False  # it names itself only
    for k in indices(texts, name):
        if k == n:
            continue
        if (brace < k < end or texts[k - 1] in (".", "->")
                or texts[k - 1] == "::" and texts[k - 2] == struct):
            return True
    return False


def drop_unused_member_functions(source: str) -> str:
    """``source`` without the member functions nothing names (step 6)."""
    shape = shape_of(source)
    texts, kinds, at, end_of = shape.texts, shape.kinds, shape.placed.start, shape.placed.end
    edits = []
    for brace in indices(texts, "{"):
        kind, struct = brace_kind(texts, kinds, brace)
        if kind != "struct" or not struct:
            continue
        try:
            end = match(texts, brace)
            members = list(_members(texts, brace + 1, end))
        except Unreadable:
            continue
        for first, last in members:
            n = _function_name(texts, kinds, first, last, struct)
            if n is None or _member_named(shape, brace, end, struct, n):
                continue
            a, b = at(first), end_of(last)
            ls = line_start(source, a)
            if source[ls:a].strip() or not rest_is_comment(source, b):
                continue  # it shares a line with other code
            edits.append((*_lines_with_comment(source, ls, b, heads_only=False), ""))
    return splice(source, edits)


def _lines_with_comment(source: str, a: int, b: int, heads_only: bool = True) -> tuple[int, int]:
    """The span of the whole lines from position a (a line's start) to b's line, with the comment
    lines right above them: a function's always, a constant's where it heads that one only (the
    line after it is blank, a comment or a closing brace)."""
    end = min(len(source), line_end(source, b) + 1)
    after = source[end:line_end(source, end)].strip() if end < len(source) else ""
    if not heads_only or after == "" or after.startswith(("//", "}")):
        while a > 0:
            above = line_start(source, a - 1)
            if not source[above:a].strip().startswith("//"):
                break
            a = above
    return a, end


def _members(texts: list[str], i: int, end: int):
    """(first, last) token of each member declaration of the struct body texts[i:end]: up to its
    `;`, or the `}` of a function's body (with a `;` after it)."""
    while i < end:
        if texts[i] in ("public", "private", "protected") and texts[i + 1] == ":":
            i += 2
            continue
        j, function = i, False
        while j < end:
            t = texts[j]
            if t == "(" and not function:
                function = "=" not in texts[i:j]
            if t in ("(", "["):
                j = match(texts, j)
            elif t == "{":
                j = match(texts, j)
                if function:
                    break
            elif t == ";":
                break
            j += 1
        if j >= end:  # what is left has no `;` or body that ends it: no member this can read
            return
        if j + 1 < end and texts[j] == "}" and texts[j + 1] == ";":
            j += 1
        yield i, j
        i = j + 1


def _function_name(texts: list[str], kinds: list[str], first: int, last: int, struct: str) -> int | None:
    """Index of the name of the member function defined or declared by tokens first .. last, or
    None where they declare something else (data, a constructor, destructor, operator, virtual)."""
    k = skip_angles(texts, first + 1) if texts[first] == "template" else first
    words = texts[k:last + 1]
    if not words or "pp" in kinds[first:last + 1] or _NOT_PLAIN & set(words):
        return None
    paren = next((n for n in range(k, last + 1) if texts[n] in ("(", "=", "{", ";")), None)
    if paren is None or texts[paren] != "(" or paren == k or kinds[paren - 1] != "id":
        return None
    if texts[paren - 1] == struct or texts[paren - 1] in _ATTRIBUTE_CALLS:
        return None
    return paren - 1
