"""The values of a file's compile-time constants, and which ``if`` and ``?:`` conditions they decide.

Only what the file itself says counts: constexpr variables whose initializer evaluates (literals,
other such constants, enumerators, ``sizeof`` of a fundamental type or an alias of one), with C++
scoping -- a block's declarations end with it, a struct's members are known outside it as S::X,
an anonymous namespace's names are its enclosing scope's. A name that may be declared again (a
parameter, a template parameter, a variable: cxx.Shape.declared) is unknown from there to the end
of that scope, and so is every name a struct declares, within it, where a member function may
name a member declared further down. A condition that names anything unknown is not decided.
"""

import bisect
import re
from dataclasses import dataclass

from gemmgen.codegen.trim.cxx import INT_TYPES, SIZEOF, Shape, Unreadable, brace_kind, indices, match

UNKNOWN = None
_UNKNOWN_NAME = ("unknown",)
_BINARY = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">": 7, "<=": 7, ">=": 7, "<<": 8,
           ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}  # binary operators' precedence


class _Scopes:
    """What the names in scope are, innermost scope last: ("value", int, unsigned), ("type", a
    fundamental type), ("enum",) (an enum type) or ("unknown",)."""

    def __init__(self, enum_types: set[str]):
        self.stack: list[dict] = [{name: ("enum",) for name in enum_types}]

    def lookup(self, name: str):
        for scope in reversed(self.stack):
            if name in scope:
                return scope[name]
        return None


class _Expr:
    """A constant expression (C++ precedence and integer arithmetic) evaluated to an int, or
    UNKNOWN. An expression with an unsigned operand is evaluated only where no value in it is
    negative (wrap-around is not modelled)."""

    def __init__(self, texts: list[str], kinds: list[str], scopes: _Scopes):
        self.texts, self.kinds, self.i, self.scopes = texts, kinds, 0, scopes
        self.unsigned = self.negative = False

    def evaluate(self):
        try:
            value = self.ternary()
        except Unreadable:
            return self.logical()
        if self.i != len(self.texts) or self.unsigned and self.negative:
            return UNKNOWN
        return value

    def logical(self):
        """The value of an expression that does not read whole, where it is a chain of `||` and
        `&&` (outside brackets) that its first operands decide, left to right, before one that does
        not read: `HP_SPLIT && k < n` is false whatever `k < n` is (it may read as a template), as
        C++ never evaluates it. `k < n && HP_SPLIT` stays unknown: C++ evaluates `k < n` first, and
        that operand may do something (a call)."""
        texts, kinds, depth, cuts = self.texts, self.kinds, 0, []
        for n, t in enumerate(texts):
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(t, 0)
            if depth == 0 and t in ("?", ":", "=", ","):
                return UNKNOWN
            if depth == 0 and t in ("||", "&&"):
                cuts.append(n)
        if not cuts:
            return UNKNOWN

        def value(a: int, b: int):
            return _Expr(texts[a:b], kinds[a:b], self.scopes).evaluate() if a < b else UNKNOWN

        ors, start = [], 0  # the operands of `||`, each a chain of `&&`
        for n in cuts + [len(texts)]:
            if n == len(texts) or texts[n] == "||":
                ors.append((start, n))
                start = n + 1
        for a, b in ors:
            start = a
            for n in [n for n in cuts if a < n < b] + [b]:
                operand = value(start, n)
                if operand is UNKNOWN:
                    return UNKNOWN
                if not operand:
                    break  # this term is false: its other operands never run
                start = n + 1
            else:
                return 1  # a true term: the terms after it never run
        return 0

    def peek(self) -> str | None:
        return self.texts[self.i] if self.i < len(self.texts) else None

    def take(self, text: str | None = None) -> int:
        """The index of the next token (which must be text, where given), read."""
        if self.i >= len(self.texts) or (text is not None and self.texts[self.i] != text):
            raise Unreadable
        self.i += 1
        return self.i - 1

    def ternary(self):
        cond = self.binary(1)
        if self.peek() != "?":
            return cond
        self.take("?")
        yes = self.ternary()
        self.take(":")
        no = self.ternary()
        return UNKNOWN if cond is UNKNOWN else yes if cond else no

    def binary(self, level: int):
        left = self.unary()
        while (op := self.peek()) in _BINARY and _BINARY[op] >= level:
            self.take()
            left = self.seen(self.apply(op, left, self.binary(_BINARY[op] + 1)))
        return left

    def seen(self, value):
        self.negative |= value is not UNKNOWN and value < 0
        return value

    @staticmethod
    def apply(op: str, a, b):
        if op == "&&" and (a == 0 or b == 0):  # known false on either side decides it
            return 0
        if op == "||" and (a not in (UNKNOWN, 0) or b not in (UNKNOWN, 0)):
            return 1
        if a is UNKNOWN or b is UNKNOWN:
            return UNKNOWN
        if op in ("/", "%"):
            if b == 0:
                return UNKNOWN
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # C++ rounds toward zero
            return q if op == "/" else a - q * b
        if op in ("<<", ">>") and not 0 <= b < 63:
            return UNKNOWN
        return int({"||": lambda: bool(a or b), "&&": lambda: bool(a and b), "|": lambda: a | b,
                    "^": lambda: a ^ b, "&": lambda: a & b, "==": lambda: a == b, "!=": lambda: a != b,
                    "<": lambda: a < b, ">": lambda: a > b, "<=": lambda: a <= b, ">=": lambda: a >= b,
                    "<<": lambda: a << b, ">>": lambda: a >> b, "+": lambda: a + b, "-": lambda: a - b,
                    "*": lambda: a * b}[op]())

    def unary(self):
        op = self.peek()
        if op in ("!", "-", "+", "~"):
            self.take()
            x = self.unary()
            return UNKNOWN if x is UNKNOWN else self.seen({"!": int(not x), "-": -x, "+": x, "~": ~x}[op])
        return self.primary()

    def primary(self):
        n = self.take()
        text, kind = self.texts[n], self.kinds[n]
        if text == "(":
            x = self.ternary()
            self.take(")")
            return x
        if kind == "num":
            m = re.fullmatch(r"(0[xX][0-9a-fA-F]+|0|[1-9][0-9]*)([uUlL]*)", text.replace("'", ""))
            if m is None:
                raise Unreadable  # floating point or octal: not needed here
            self.unsigned |= "u" in m[2].lower()
            return int(m[1], 0)
        if text in ("true", "false"):
            return int(text == "true")
        if text == "sizeof":
            self.take("(")
            name = self.texts[self.take()]
            self.take(")")
            found = self.scopes.lookup(name)
            self.unsigned = True
            return SIZEOF.get(found[1] if found and found[0] == "type" else name if found is None else None, UNKNOWN)
        if kind == "id":
            name = text
            while self.peek() == "::":
                self.take()
                name += "::" + self.texts[self.take()]
            if self.peek() in ("(", "<", "[", ".", "->"):
                raise Unreadable  # a call, a template, a member: not a named constant
            found = self.scopes.lookup(name)
            if not found or found[0] != "value":
                return UNKNOWN
            self.unsigned |= found[2]
            return found[1]
        raise Unreadable


@dataclass(frozen=True)
class Decided:
    index: int  # of the `if` among the tokens (of the `?` for a conditional expression)
    live: bool  # whether the condition holds
    first: int = -1  # a conditional expression's: its condition's first token


def decided_conditions(shape: Shape, ternaries: bool = False) -> list[Decided]:
    """The ``if`` statements (constexpr or not) of the code whose condition the file's constants
    decide, in order; with ternaries, the conditional expressions (c ? x : y) instead, but those in a
    constexpr declaration or an ``if`` condition, which are evaluated whole. One reading of the
    code finds both, kept with the shape: the steps that ask for each read the same text in turn."""
    found = shape.__dict__.get("_decided")
    if found is None:
        found = shape.__dict__["_decided"] = _decide(shape)
    return [d for d in found if (d.first >= 0) == ternaries]


def _decide(shape: Shape) -> list[Decided]:
    texts, kinds = shape.texts, shape.kinds
    enum_types = {texts[i + 1] for i in indices(texts, "enum") if i + 1 < len(texts) and kinds[i + 1] == "id"}
    scopes = _Scopes(enum_types)
    opened: list[tuple[str, str | None]] = []  # per open brace, brace_kind's
    found = []
    declared = set(shape.declared)
    # the tokens that may change what is known (the others are stepped over): directives, the words
    # and braces below, and what may be a declarator
    step_words = _STEPS  # a local: looked up once per token below
    steps = sorted(declared.union([i for i, x in enumerate(texts) if x in step_words], indices(kinds, "pp")))
    p = 0
    while p < len(steps):
        i = steps[p]
        text = texts[i]
        then = i + 1  # the index to read on from
        if kinds[i] == "pp":
            m = re.match(r"#\s*define\s+(\w+)", text)
            if m:
                scopes.stack[0][m[1]] = _UNKNOWN_NAME
        elif text == "if" and i + 1 < len(texts) and texts[i + 1] in ("constexpr", "("):
            paren = i + 2 if texts[i + 1] == "constexpr" else i + 1
            close = match(texts, paren)
            if _may_decide(texts, kinds, paren + 1, close, scopes):
                value = _Expr(texts[paren + 1:close], kinds[paren + 1:close], scopes).evaluate()
                if value is not UNKNOWN:
                    found.append(Decided(i, bool(value)))
            then = close + 1
        elif text == "?":
            first = condition_first(texts, kinds, i)
            if first < i and _may_decide(texts, kinds, first, i, scopes):
                value = _Expr(texts[first:i], kinds[first:i], scopes).evaluate()
                if value is not UNKNOWN:
                    found.append(Decided(i, bool(value), first))
        elif text == "constexpr" or text in ("typedef", "using") and texts[i - 1] != "::":
            then = _declaration(texts, kinds, i, scopes)
        elif text == "enum" and (body := _enum_body(texts, i)) is not None:
            end = match(texts, body)
            _enumerators(texts[body + 1:end], kinds[body + 1:end], scopes)
            then = end + 1
        elif text == "{":
            opened.append(brace_kind(texts, kinds, i))
            if opened[-1][0] != "namespace":
                scopes.stack.append({})
            if opened[-1][0] == "struct":
                end = match(texts, i)
                scopes.stack[-1].update({texts[n]: _UNKNOWN_NAME for n in shape.declared_in(i + 1, end)})
        elif text == "}" and opened:
            kind, name = opened.pop()
            if kind != "namespace":
                inner = scopes.stack.pop()
                if kind == "struct" and name:
                    scopes.stack[-1].update({f"{name}::{key}": val for key, val in inner.items()})
                    scopes.stack[-1][name] = _UNKNOWN_NAME
        elif i in declared:
            scopes.stack[-1][text] = _UNKNOWN_NAME
        p = p + 1 if then == i + 1 else bisect.bisect_left(steps, then, p + 1)
    return found


_STEPS = {"if", "constexpr", "typedef", "using", "enum", "{", "}", "?"}


def _may_decide(texts: list[str], kinds: list[str], a: int, b: int, scopes: _Scopes) -> bool:
    """Whether the condition of tokens [a, b) names a known constant (or sizeof, true, false), or no
    name at all: the only conditions worth evaluating (most name variables only)."""
    named, n = False, a
    while n < b:
        if kinds[n] == "id":
            if texts[n] in ("sizeof", "true", "false"):
                return True
            name = texts[n]
            while n + 2 < b and texts[n + 1] == "::":  # a struct's member: S::X
                n += 2
                name += "::" + texts[n]
            found = scopes.lookup(name)
            if found is not None and found[0] == "value":
                return True
            named = True
        n += 1
    return not named
# What may stand before the condition of a conditional expression: what binds less tightly (and
# brackets, statements' edges and the words that start one). Everything else binds more tightly,
# so the condition is the longest run of other tokens before the `?` (a template's `<` is no
# stop: a condition read through one names a template, which evaluates to nothing).
_BEFORE_A_CONDITION = {",", ";", "?", ":", "{", "}", "=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=",
                       ">>=", "return", "case", "if", "else", "do", "while", "for", "switch", "throw"}


def condition_first(texts: list[str], kinds: list[str], q: int) -> int:
    """The index of the first token of the condition of the conditional expression whose `?` is token q."""
    k, depth = q - 1, 0
    while k >= 0:
        t = texts[k]
        if t in (")", "]"):
            depth += 1
        elif t in ("(", "["):
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (t in _BEFORE_A_CONDITION or kinds[k] == "pp"):
            break
        k -= 1
    return k + 1


def _enum_body(texts: list[str], i: int) -> int | None:
    """Index of the `{` of the enum declared at token i (`enum`), or None (a declaration only)."""
    while i < len(texts) and texts[i] not in ("{", ";"):
        i += 1
    return i if i < len(texts) and texts[i] == "{" else None


def _enumerators(texts: list[str], kinds: list[str], scopes: _Scopes):
    value, j = 0, 0
    while j < len(texts):
        name, k = texts[j], j + 1
        if k < len(texts) and texts[k] == "=":
            e = k + 1
            while e < len(texts) and texts[e] != ",":
                e += 1
            value = _Expr(texts[k + 1:e], kinds[k + 1:e], scopes).evaluate()
            k = e
        scopes.stack[-1][name] = _UNKNOWN_NAME if value is UNKNOWN else ("value", value, False)
        value = UNKNOWN if value is UNKNOWN else value + 1
        j = k + 1


def _declaration(all_texts: list[str], all_kinds: list[str], i: int, scopes: _Scopes) -> int:
    """Records what the declaration at token i (`constexpr`, `typedef` or `using`) declares;
    returns the index after it."""
    end = i
    while end < len(all_texts) and all_texts[end] != ";":
        end = match(all_texts, end) + 1 if all_texts[end] in ("(", "[", "{") else end + 1
    texts, kinds = all_texts[i:end], all_kinds[i:end]
    scope = scopes.stack[-1]
    if texts[0] == "typedef":  # typedef float gg_out;
        names = [t for t, kind in zip(texts[1:], kinds[1:]) if kind == "id"]
        if names and len(names) == len(texts) - 1:
            scope[names[-1]] = _alias(names[:-1], scopes)
        elif names:
            scope[names[-1]] = _UNKNOWN_NAME
        return end + 1
    if texts[0] == "using":  # using T = __half;
        if len(texts) >= 4 and kinds[1] == "id" and texts[2] == "=":
            scope[texts[1]] = _alias(texts[3:], scopes) if all(kind == "id" for kind in kinds[3:]) else _UNKNOWN_NAME
        return end + 1
    # constexpr TYPE NAME = EXPR [, NAME = EXPR]...
    j, type_words = 1, []
    while j + 1 < len(texts) and not (kinds[j] == "id" and texts[j + 1] == "="):
        if texts[j] in ("(", "{"):
            return i + 1  # a constexpr function: read on
        type_words.append(texts[j])
        j += 1
    while j + 1 < len(texts) and kinds[j] == "id" and texts[j + 1] == "=":
        k, depth = j + 2, 0
        while k < len(texts) and not (depth == 0 and texts[k] == ","):
            depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(texts[k], 0)
            k += 1
        scope[texts[j]] = _typed(type_words, _Expr(texts[j + 2:k], kinds[j + 2:k], scopes).evaluate(), scopes)
        j = k + 1
    return end + 1


def _alias(words: list[str], scopes: _Scopes):
    if len(words) == 1:
        found = scopes.lookup(words[0])
        if found and found[0] == "type":
            return found
        if found is None and words[0] in SIZEOF:
            return ("type", words[0])
    return _UNKNOWN_NAME


def _typed(type_words: list[str], value, scopes: _Scopes):
    """What a constant of that type initialized with value is (C++'s conversion), or unknown."""
    words = [w for w in type_words if w not in ("static", "const", "inline", "[", "]", "maybe_unused")]
    if value is UNKNOWN or not words:
        return _UNKNOWN_NAME
    if words == ["bool"]:
        return ("value", int(bool(value)), False)
    if all(w in INT_TYPES for w in words):
        unsigned = "unsigned" in words or words[0] in ("size_t", "uint32_t", "uint64_t")
        bits = 64 if "long" in words or words[0] in ("size_t", "uint64_t", "int64_t") else 32
        if unsigned and value < 0 or not -(2 ** (bits - 1)) <= value < 2 ** bits:
            return _UNKNOWN_NAME
        return ("value", value, unsigned)
    if words == ["auto"] or len(words) == 1 and scopes.lookup(words[0]) == ("enum",):
        return ("value", value, False)
    return _UNKNOWN_NAME
