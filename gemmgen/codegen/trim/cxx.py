"""Reading C++ text as far as trimming needs: tokens, brackets, statements, declarators, the
nesting of braces, and lines. A token is its text and its kind, kept in lists side by side (a
file has ~20K tokens: an object for each costs more than all the reading). What does not read as
expected raises Unreadable, and the caller leaves that code as it is."""

import bisect
import re
import threading
from collections import Counter
from functools import cached_property, lru_cache
from itertools import accumulate, compress
from operator import itemgetter

# The punctuators of one character (the longer ones are spelled out in _TOKEN, by first character)
_PUNCT_CHARS = "{}()[];:,.?!~+-*/%&|^=<>#"
# A token. Where alternatives can start alike, the first to match is the right one: a prefixed
# string before an identifier, a comment or a number before punctuation, a directive before `#`;
# punctuation takes its longest form (spelled out as a tree by first character). Each alternative
# starts with a character or a set, which the regex engine checks before trying it. Between
# tokens, re.split leaves the whitespace: every other character starts a token, the last
# alternative's where no other does.
_TOKEN = re.compile(
    r"([(){}\[\];,?~]"
    r"|u8?\"(?:\\.|[^\"\\\n])*\"|[UL]\"(?:\\.|[^\"\\\n])*\""
    r"|[A-Za-z_][A-Za-z0-9_]*"
    r"|[0-9](?:[eEpP][+-]|[0-9a-zA-Z_.'])*|\.[0-9](?:[eEpP][+-]|[0-9a-zA-Z_.'])*"
    r"|//[^\n]*|/\*.*?\*/"
    r"|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'"
    r"|#(?:\\\n|[^\n])*"  # a directive: to its line's end, continuations included (if `#` starts its line)
    r"|<(?:<=?|=)?|>(?:>=?|=)?|\.(?:\.\.)?|-(?:>\*?|[-=])?|::?|\+[+=]?|==?|!=?|&[&=]?|\|[|=]?|\*=?|/=?|%=?|\^=?"
    r"|[^ \t\r\f\v\n])",  # a character no token starts with
    re.DOTALL)
# The kind of a token by its first character; None: it takes a second look (_scan)
_KIND_OF_FIRST = {**{c: "id" for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"},
                  **{c: "num" for c in "0123456789"}, **{p: "punct" for p in _PUNCT_CHARS},
                  **{c: None for c in "uUL\"'/.#"}}
_FIRST = itemgetter(0)

# Bytes of the fundamental types the templates name (CUDA's, on every target)
SIZEOF = {"char": 1, "bool": 1, "short": 2, "int": 4, "unsigned": 4, "float": 4, "double": 8, "__half": 2,
          "__nv_bfloat16": 2}
INT_TYPES = {"bool", "char", "short", "int", "unsigned", "long", "signed", "size_t", "uint32_t", "uint64_t",
             "int32_t", "int64_t"}
OPEN = {"(": ")", "[": "]", "{": "}"}


class Unreadable(Exception):
    """Code that does not read as the trimmer expects: left as it is."""


class Placed:
    """Tokens in order -- ``texts`` and ``kinds`` (id, num, str, punct, comment, pp: a whole
    preprocessor directive) -- and where each lies in its text: token n starts at starts[n] plus
    the shift of its run (the last r with firsts[r] <= n). splice moves the tokens after an edit
    by giving them a run, not by adding to each token's start."""

    __slots__ = ("texts", "kinds", "starts", "firsts", "shifts")

    def __init__(self, texts: list[str], kinds: list[str], starts: list[int], firsts: list[int], shifts: list[int]):
        self.texts, self.kinds, self.starts, self.firsts, self.shifts = texts, kinds, starts, firsts, shifts

    def start(self, n: int) -> int:
        return self.starts[n] + self.shifts[bisect.bisect_right(self.firsts, n) - 1]

    def end(self, n: int) -> int:
        return self.start(n) + len(self.texts[n])

    def all_starts(self) -> list[int]:
        """start(n) of every token."""
        out = []
        for first, until, shift in zip(self.firsts, self.firsts[1:] + [len(self.starts)], self.shifts):
            out += map(shift.__add__, self.starts[first:until]) if shift else self.starts[first:until]
        return out

    def first_ending_after(self, pos: int) -> int:
        """Index of the first token that ends after pos (len(texts): none)."""
        return bisect.bisect_right(range(len(self.texts)), pos, key=self.end)

    def offsets(self) -> list[tuple[str, str, int, int]]:
        """(kind, text, start, end) of each token."""
        return [(kind, text, self.start(n), self.end(n)) for n, (kind, text) in enumerate(zip(self.kinds, self.texts))]


class _Placing:
    """A Placed being made, a run of another's tokens at a time."""

    def __init__(self):
        self.texts, self.kinds, self.starts, self.firsts, self.shifts = [], [], [], [], []

    def move(self, placed: Placed, a: int, b: int, by: int):
        """placed's tokens [a, b), moved by ``by`` characters."""
        r = bisect.bisect_right(placed.firsts, a) - 1
        while a < b:
            until = min(b, placed.firsts[r + 1]) if r + 1 < len(placed.firsts) else b
            shift = placed.shifts[r] + by
            if not self.shifts or self.shifts[-1] != shift:
                self.firsts.append(len(self.texts))
                self.shifts.append(shift)
            self.texts += placed.texts[a:until]
            self.kinds += placed.kinds[a:until]
            self.starts += placed.starts[a:until]
            a, r = until, r + 1

    def done(self) -> Placed:
        return Placed(self.texts, self.kinds, self.starts, self.firsts or [0], self.shifts or [0])


class Read:
    """A text's tokens: ``code``, those but its comments, and ``comments``."""

    __slots__ = ("code", "comments")

    def __init__(self, code: Placed, comments: Placed):
        self.code, self.comments = code, comments

    def offsets(self) -> list[tuple[str, str, int, int]]:
        """(kind, text, start, end) of every token, in order."""
        return sorted(self.code.offsets() + self.comments.offsets(), key=lambda t: t[2])


# The texts read last, newest last: read's cache, which splice fills with the tokens of the text it
# makes, so that a pass reads its predecessor's output without scanning it.
_KNOWN: dict[str, Read] = {}
_KNOWN_MAX = 8
_KNOWN_LOCK = threading.Lock()  # tuners and tests trim in several threads at once


def _scan(text: str, pos: int, endpos: int) -> Read:
    """The tokens of text[pos:endpos], pos a line's start, at their offsets in text."""
    texts, kinds, starts, comments, comment_starts = [], [], [], [], []
    while pos is not None:
        parts = _TOKEN.split(text[pos:endpos])  # whitespace, a token, whitespace, ...
        found = parts[1::2]
        at = list(accumulate(map(len, parts[:-1]), initial=pos))[1::2]  # where each token starts
        kind = list(map(_KIND_OF_FIRST.get, map(_FIRST, found)))
        dropped, after = [], None  # the comments; where to read on after a `#` that does not start its line
        for n in indices(kind, None):  # which alternative matched?
            token = found[n]
            first = token[0]
            if first in "uUL":
                kind[n] = "str" if token[-1] == '"' else "id"
            elif first in "\"'":
                kind[n] = "str" if len(token) > 1 else "bad"
            elif first == "/":
                kind[n] = "comment" if token[1:2] in ("/", "*") else "punct"
                if kind[n] == "comment":
                    dropped.append(n)
            elif first == ".":
                kind[n] = "num" if len(token) > 1 and token[1] != "." else "punct"
            elif first != "#":
                kind[n] = "bad"
            elif text[text.rfind("\n", 0, at[n]) + 1:at[n]].strip(" \t"):  # `#` not starting its line
                after = at[n] + 1 + (token[1:2] == "#")
                found[n:], kind[n:], at[n:] = [text[at[n]:after]], ["punct"], [at[n]]
                break
            else:
                kind[n] = "pp"
        if "bad" in kind:
            n = at[kind.index("bad")]
            raise ValueError(f"cannot tokenize at {text[n:n + 20]!r}")
        if dropped:
            comments += [found[n] for n in dropped]
            comment_starts += [at[n] for n in dropped]
            kept = list(map("comment".__ne__, kind))
            found, kind, at = list(compress(found, kept)), list(compress(kind, kept)), list(compress(at, kept))
        texts += found
        kinds += kind
        starts += at
        pos = after
    return Read(Placed(texts, kinds, starts, [0], [0]),
                Placed(comments, ["comment"] * len(comments), comment_starts, [0], [0]))


def scan(text: str) -> Read:
    """The tokens of C++ source, comments apart; a preprocessor directive is one ``pp`` token.
    Raises ValueError at a character no token starts with."""
    return _scan(text, 0, len(text))


def _remember(text: str, found: Read) -> Read:
    with _KNOWN_LOCK:
        _KNOWN.pop(text, None)
        _KNOWN[text] = found
        while len(_KNOWN) > _KNOWN_MAX:
            del _KNOWN[next(iter(_KNOWN))]
    return found


def read(text: str) -> Read:
    """scan(text), or what splice found when it made text."""
    with _KNOWN_LOCK:
        found = _KNOWN.get(text)
    return found if found is not None else _remember(text, scan(text))


def splice(source: str, edits) -> str:
    """``source`` with each (a, b, text) of ``edits`` applied: source[a:b] replaced by text. The
    edits do not overlap. The result's tokens are source's outside the lines the edits touch
    (moved by what the edits before them added or removed) and those lines' tokens scanned
    again; read then finds them. The line an edit ends on counts as touched, even at its start,
    but where the edit only removes whole lines. A token of source that crosses such a line's
    edge widens the lines scanned, so the tokens are those scan would find."""
    edits = sorted(edits)
    if not edits:
        return source
    old = read(source)
    both = (old.code, old.comments)
    pieces, pos = [], 0
    for a, b, text in edits:
        pieces += [source[pos:a], text]
        pos = b
    pieces.append(source[pos:])
    new = "".join(pieces)
    regions = []  # [first line's start, last line's end + 1) of source, the size change of its edits
    for a, b, text in edits:
        if not text and line_start(source, a) == a and line_start(source, b) == b:
            ra, rb = a, b  # whole lines removed: the line after them reads as it did
        else:
            ra, rb = line_start(source, a), min(len(source), line_end(source, b) + 1)
        widened = True
        while widened:  # to whole tokens
            widened = False
            for placed in both:
                i = placed.first_ending_after(ra)
                if i < len(placed.texts) and placed.start(i) < ra:
                    ra, widened = line_start(source, placed.start(i)), True
                j = bisect.bisect_left(range(len(placed.texts)), rb, key=placed.end)  # the first ending at or after rb
                if j < len(placed.texts) and placed.start(j) < rb < placed.end(j):
                    rb, widened = min(len(source), line_end(source, placed.end(j)) + 1), True
        change = len(text) - (b - a)
        while regions and ra <= regions[-1][1]:  # it meets the lines of the edits before it
            pa, pb, pc = regions.pop()
            ra, rb, change = min(ra, pa), max(rb, pb), change + pc
        regions.append((ra, rb, change))
    # No token crosses a region's edge: those ending by ra lie before it, the others from rb on after it
    code, comments = _Placing(), _Placing()
    shift, k, c = 0, 0, 0  # the next token of old.code and of old.comments to place
    for ra, rb, change in regions:
        before = old.code.first_ending_after(ra)
        code.move(old.code, k, before, shift)
        before = old.comments.first_ending_after(ra)
        comments.move(old.comments, c, before, shift)
        scanned = _scan(new, ra + shift, rb + shift + change)
        code.move(scanned.code, 0, len(scanned.code.texts), 0)
        comments.move(scanned.comments, 0, len(scanned.comments.texts), 0)
        k, c = old.code.first_ending_after(rb), old.comments.first_ending_after(rb)
        shift += change
    code.move(old.code, k, len(old.code.texts), shift)
    comments.move(old.comments, c, len(old.comments.texts), shift)
    _remember(new, Read(code.done(), comments.done()))
    return new


@lru_cache(maxsize=8)
def shape_of(text: str) -> "Shape":
    """The Shape of text's code."""
    return Shape(read(text).code)


def indices(items: list, value) -> list[int]:
    """The indices of value in items, in order."""
    out, i = [], -1
    try:
        while True:
            i = items.index(value, i + 1)
            out.append(i)
    except ValueError:
        return out


def directive_names(text: str) -> list[str]:
    """The identifiers in a directive."""
    return re.findall(r"[A-Za-z_]\w*", text)


# ---- brackets and statements ----------------------------------------------------------------------

def match(texts: list[str], i: int) -> int:
    """Index of the bracket closing texts[i]."""
    depth = 0
    for j in range(i, len(texts)):
        t = texts[j]
        if t in OPEN:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    raise Unreadable


def skip_angles(texts: list[str], k: int) -> int:
    """Index after the template parameter list that starts at texts[k] (`<`)."""
    depth = 0
    while k < len(texts):
        depth += {"<": 1, ">": -1, ">>": -2}.get(texts[k], 0)
        if texts[k] in ("(", "["):
            k = match(texts, k)
        k += 1
        if depth <= 0:
            return k
    raise Unreadable


def statement_end(texts: list[str], kinds: list[str], i: int) -> int:
    """Index of the last token of the statement that starts at token i (directives before it,
    such as #pragma unroll, belong to it)."""
    while kinds[i] == "pp":
        i += 1
    t = texts[i]
    if t == "{":
        return match(texts, i)
    if t == "if":
        end = statement_end(texts, kinds, match(texts, i + 1 + (texts[i + 1] == "constexpr")) + 1)
        if end + 1 < len(texts) and texts[end + 1] == "else":
            end = statement_end(texts, kinds, end + 2)
        return end
    if t in ("for", "while", "switch"):
        return statement_end(texts, kinds, match(texts, i + 1) + 1)
    if t == "do":
        return match(texts, statement_end(texts, kinds, i + 1) + 2) + 1
    if t == "try":
        end = match(texts, i + 1)
        while end + 1 < len(texts) and texts[end + 1] == "catch":
            end = match(texts, match(texts, end + 2) + 1)
        return end
    j = i
    while texts[j] != ";":
        if texts[j] in OPEN:
            j = match(texts, j)
        elif texts[j] in (")", "]", "}"):
            raise Unreadable
        j += 1
    return j


_BEFORE_AN_EXPRESSION = {"return", "case", "else", "sizeof", "throw", "new", "delete", "goto", "co_return",
                         "co_yield", "operator", "if", "constexpr", "do", "while", "for", "switch", "not", "and", "or"}
_AFTER_A_DECLARATOR = {"=", ";", ",", ")", ">", "[", "{", "(", ":"}
_POINTER_LIKE = {"*", "&", "&&", ">", ">>", "..."}


def declarators(texts: list[str], kinds: list[str], i: int) -> list[tuple[int, int]] | None:
    """(its name, the last token of its initializer) for each declarator of the constexpr variable
    declaration whose `constexpr` is token i; None where that declares something else (a function)."""
    j = i + 1
    while j + 1 < len(texts) and not (kinds[j] == "id" and texts[j + 1] == "="):
        if texts[j] in ("(", "{", ";", "=") or kinds[j] == "pp":
            return None
        j += 1
    out = []
    while True:
        k = j + 2
        while texts[k] not in (",", ";"):
            if texts[k] in OPEN:
                k = match(texts, k)
            elif texts[k] in (")", "]", "}"):
                raise Unreadable
            k += 1
        out.append((j, k - 1))
        if texts[k] == ";":
            return out
        j = k + 1
        if not (kinds[j] == "id" and texts[j + 1] == "="):
            raise Unreadable


def brace_kind(texts: list[str], kinds: list[str], i: int) -> tuple[str, str | None]:
    """What the `{` at token i opens: ("namespace", None) for an anonymous namespace or an extern
    "C" block (their names are the enclosing scope's), ("named", name) for a named namespace,
    ("struct", name) for a struct, class or union, else ("block", None)."""
    j = i - 1
    if j >= 0 and texts[j] == "namespace":
        return "namespace", None
    if j >= 1 and kinds[j] == "id" and texts[j - 1] == "namespace":
        return "named", texts[j]
    if j >= 1 and kinds[j] == "str" and texts[j - 1] == "extern":
        return "namespace", None
    k = j  # struct NAME [final] [: bases] {
    while k >= 0 and texts[k] not in (";", "{", "}", ")", "struct", "class", "union"):
        k -= 1
    if k >= 0 and texts[k] in ("struct", "class", "union"):
        return "struct", texts[k + 1] if k + 1 < i and kinds[k + 1] == "id" else None
    return "block", None


_NESTING_MARKS = {"{", "}", ";"}  # and directives: the tokens that end a namespace-scope declaration


class Shape:
    """Facts of a file's code (its tokens but comments), each worked out where first asked for:
    where a token lies among the braces (parent, start), which identifiers may be names being
    declared there (``declared``) and how often each name is named (``uses``)."""

    def __init__(self, placed: Placed):
        self.placed = placed  # where each token lies
        self.texts, self.kinds = placed.texts, placed.kinds

    @cached_property
    def uses(self) -> Counter:
        """How many times each name is named: as an identifier or in a directive."""
        uses = Counter(self.texts)  # an identifier's text is no other token's
        for n in indices(self.kinds, "pp"):
            uses.update(directive_names(self.texts[n]))
        return uses

    @cached_property
    def _braces(self) -> tuple[list[int], list[int]]:
        """The braces of the code in order, and the innermost `{` open after each (-1: none)."""
        texts = self.texts
        braces, after, stack = sorted(indices(texts, "{") + indices(texts, "}")), [], []
        for n in braces:
            if texts[n] == "{":
                stack.append(n)
            elif stack:
                stack.pop()
            after.append(stack[-1] if stack else -1)
        return braces, after

    def parent(self, n: int) -> int:
        """The `{` around token n (-1: none); for a brace, the one around the block it opens or closes."""
        braces, after = self._braces
        k = bisect.bisect_left(braces, n)  # braces[:k] come before n
        if k < len(braces) and braces[k] == n and self.texts[n] == "}":
            return after[k]
        return after[k - 1] if k else -1

    def start(self, n: int) -> int:
        """The first token of the namespace-scope declaration around token n (its function's)."""
        texts, kinds = self.texts, self.kinds
        outermost = n  # the outermost block around n but namespaces' (n where none)
        brace = self.parent(n)
        if texts[n] == "}":  # it lies in the block it closes: the one open before it
            braces, after = self._braces
            k = bisect.bisect_left(braces, n)
            brace = after[k - 1] if k else -1
        while brace >= 0:
            if not (texts[brace - 1] == "namespace" or brace > 1 and texts[brace - 2] == "namespace"):
                outermost = brace
            brace = self.parent(brace)
        k = outermost - 1  # the mark before it: a `;`, a brace or a directive
        while k >= 0 and texts[k] not in _NESTING_MARKS and kinds[k] != "pp":
            k -= 1
        return k + 1

    @cached_property
    def declared(self) -> list[int]:
        """The identifiers that may be names being declared there (a parameter, a template parameter,
        a variable, a type): a type-like word before them, `=` `;` `,` `)` and the like after, erring
        towards yes."""
        texts, kinds = self.texts, self.kinds
        after = _AFTER_A_DECLARATOR
        return [i for i, (kind, nxt) in enumerate(zip(kinds[1:-1], texts[2:]), 1)
                if nxt in after and kind == "id"
                and (texts[i - 1] not in _BEFORE_AN_EXPRESSION if kinds[i - 1] == "id"
                     else texts[i - 1] in _POINTER_LIKE)]

    def declared_in(self, a: int, b: int) -> list[int]:
        """The indices of ``declared`` in [a, b)."""
        declared = self.declared
        return declared[bisect.bisect_left(declared, a):bisect.bisect_left(declared, b)]

    def braces_around(self, n: int) -> list[int]:
        """The `{` around token n, innermost first."""
        out = []
        brace = self.parent(n)
        while brace >= 0:
            out.append(brace)
            brace = self.parent(brace)
        return out

    def lambda_introducer(self, brace: int) -> int | None:
        """Index of the `[` of the lambda whose body opens at token brace, or None where it is no
        lambda's."""
        texts, k = self.texts, brace - 1
        while k >= 0:
            t = texts[k]
            if t == "]":
                depth = 0
                for j in range(k, -1, -1):
                    depth += {"]": 1, "[": -1}.get(texts[j], 0)
                    if depth == 0:
                        before = texts[j - 1] if j > 0 else ";"
                        return j if before in ("=", "(", ",", "{", ";", "return", "}", ")") else None
                return None
            if t == ")":  # the parameters, or __attribute__((...)) and the like after them
                k = _opening(texts, k) - 1
                if k >= 0 and texts[k] in ("__attribute__", "noexcept", "decltype"):
                    k -= 1
                elif k >= 0 and texts[k] != "]":
                    return None
                continue
            if self.kinds[k] == "id" or t in ("->", "::", "<", ">", "*", "&"):
                k -= 1  # specifiers, a trailing return type
                continue
            return None
        return None


def _opening(texts: list[str], k: int) -> int:
    """Index of the `(` that the `)` at texts[k] closes."""
    depth = 0
    for j in range(k, -1, -1):
        depth += {")": 1, "(": -1}.get(texts[j], 0)
        if depth == 0:
            return j
    raise Unreadable


# ---- lines ----------------------------------------------------------------------------------------

def line_start(source: str, pos: int) -> int:
    return source.rfind("\n", 0, pos) + 1


def line_end(source: str, pos: int) -> int:
    end = source.find("\n", pos)
    return len(source) if end < 0 else end


def indent_at(source: str, pos: int) -> int:
    """Indentation of the line holding pos."""
    line = source[line_start(source, pos):line_end(source, pos)]
    return len(line) - len(line.lstrip(" "))


def rest_is_comment(source: str, pos: int) -> bool:
    """Whether the text from pos to the end of its line is blank or a // comment."""
    rest = source[pos:line_end(source, pos)].strip()
    return not rest or rest.startswith("//")


def dedent(lines: list[str], by: int) -> list[str]:
    """``lines`` moved ``by`` columns left (directives stay in column 0); Unreadable where one
    starts left of that."""
    out = []
    for line in lines:
        if not line.strip() or line.startswith("#"):
            out.append(line.rstrip())
        elif line[:by].strip():
            raise Unreadable
        else:
            out.append(line[by:])
    return out
