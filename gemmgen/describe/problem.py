"""What a GEMM computes: its shape (M x N x K, as typed on the command line) and its variant (the
layouts of A and B, the type of C, the epilogue, batches), each variant key declared once in
FIELDS with its values, default, help, name part and C++ codes; and which variants a family
computes (Variants)."""

import re
from dataclasses import dataclass

from gemmgen.describe import scaling
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.errors import InvalidParameter

MAX_DIM = 2**31 - 1  # M, N and K are C ints in every launcher (and in cuBLAS)


@dataclass(frozen=True, order=True)
class Shape:
    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def bytes_moved(self, element_bytes: int, c_bytes: int = 4) -> int:
        """The least memory traffic of C = A @ B: A and B (elements of ``element_bytes``) read once
        and C (elements of ``c_bytes``) written once. Thin products are bound by it, not by flops."""
        return (self.m * self.k + self.k * self.n) * element_bytes + self.m * self.n * c_bytes


def parse_shape(text: str) -> Shape:
    """``4096`` (a cube) or ``MxNxK``, in ASCII digits; raises InvalidParameter on anything else
    (``４０９６``, whose full-width digits int() would read, included)."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"[0-9]+", raw):
        side = int(raw)
        dims = (side, side, side)
    elif m := re.fullmatch(r"([0-9]+)x([0-9]+)x([0-9]+)", raw):
        dims = tuple(int(g) for g in m.groups())
    else:
        raise InvalidParameter(f"cannot read shape {text!r}; write MxNxK in ASCII digits (e.g. 4095x4097x4093) or "
                               "one number for a cube (e.g. 4096)")
    if min(dims) < 1:
        raise InvalidParameter(f"shape {text!r}: M, N and K must be >= 1")
    if max(dims) > MAX_DIM:
        raise InvalidParameter(f"shape {text!r}: M, N and K must be <= {MAX_DIM} (2^31 - 1): kernels and cuBLAS take "
                               "them as 32-bit integers")
    return Shape(*dims)


# ---- the problem variant: operand layouts, the type of C, the epilogue, batches -------------


@dataclass(frozen=True)
class Field:
    """One key of the problem variant, declared once: its values, its default, what it means, how a
    canonical name writes it and its C++ codes. Everything that names a variant reads FIELDS:
    Variant (its attributes, checks and suffix), ``--set`` and the command-line options, the
    database's columns and their defaults, the canonical names (gemmgen.describe.names) and the header the
    templates get the codes from (templates/vocab.cuh.j2)."""

    key: str  # Variant's attribute, the --set key, the database column
    choices: tuple[str, ...]
    default: str
    help: str  # the values in words: the option's help, and the error's explanation
    name_part: str  # a value away from the default in a canonical name: the word in place of {}
    what: str = ""  # the key in words, where its name does not say it ("the type of C")
    option: str = ""  # the command-line option, where it is not --<key>
    words: tuple[tuple[str, str], ...] = ()  # (value, word): the name's word where it is not the value
    cpp: str = ""  # the prefix of the C++ codes (GG_<KEY> where not given): GG_BIAS_ROW, ...
    codes: tuple[tuple[str, int], ...] = ()  # (value, code) where the C++ code is not the value's index

    def __post_init__(self):
        assert self.default in self.choices, f"{self.key}: default {self.default!r} is not a choice"

    @property
    def flag(self) -> str:
        """The command-line option that gives this key (``--trans``, ``--batch-mode``)."""
        return self.option or f"--{self.key}"

    def check(self, value: str) -> None:
        """Raises InvalidParameter, naming the allowed values, where ``value`` is not one."""
        if value not in self.choices:
            what = f" ({self.what})" if self.what else ""
            raise InvalidParameter(f"{self.key}={value!r} is not allowed; {self.key}{what} must be one of: "
                                   f"{', '.join(self.choices)} ({self.help})")

    def name_text(self, value: str) -> str:
        """The canonical name's part for ``value``: empty for the default (name_pattern reads it back)."""
        return "" if value == self.default else self.name_part.format(dict(self.words).get(value, value))

    def name_pattern(self) -> str:
        """A regular expression of name_text's parts, the word in a group named for the key
        (name_value turns a match back into the value)."""
        words = "|".join(dict(self.words).get(c, c) for c in self.choices if c != self.default)
        return f"(?:{re.escape(self.name_part).replace(re.escape('{}'), f'(?P<{self.key}>{words})')})?"

    def name_value(self, word: str) -> str:
        """The value a name's word (a name_pattern match) stands for."""
        return {w: v for v, w in self.words}.get(word, word)

    def code(self, value: str) -> int:
        """The C++ code of ``value`` (templates/vocab.cuh.j2): its index among the choices unless
        ``codes`` says otherwise."""
        return dict(self.codes).get(value, self.choices.index(value))

    @property
    def cpp_prefix(self) -> str:
        """The prefix of the C++ names of the codes: ``GG_BIAS``."""
        return self.cpp or f"GG_{self.key.upper()}"

    def cpp_name(self, value: str) -> str:
        """The C++ name of ``value``'s code: ``GG_BIAS_ROW``."""
        return f"{self.cpp_prefix}_{value.upper()}"

    @property
    def cpp_type(self) -> str:
        """The C++ enum of the codes: ``gg_bias``."""
        return self.cpp_prefix.lower()

    @property
    def cpp_const(self) -> str:
        """The C++ constant of a kernel's value: ``GG_BIAS``."""
        return f"GG_{self.key.upper()}"

    @property
    def cpp_codes(self) -> tuple[str, ...]:
        """The enum's members: ``GG_BIAS_NONE = 0``, ..."""
        return tuple(f"{self.cpp_name(value)} = {self.code(value)}" for value in self.choices)


_C_TYPES = ("fp32", "fp16", "bf16")

#: The problem variant, key by key, in the order of Variant's attributes, of ``--set`` and of a
#: canonical name's suffix.
FIELDS: tuple[Field, ...] = (
    # Layouts of (A, B) as BLAS names them ("layout" is a parameter of the register family): "n" is
    # the operand as gemmgen always took it (A: M x K, B: K x N, both row-major), "t" the operand
    # stored transposed (A stored K x M, B stored N x K, row-major: column-major); "nt" is
    # torch.nn.functional.linear's x @ W^T.
    Field("trans", ("nn", "nt", "tn", "tt"), "nn",
          "layouts of A and B: nn (A M x K, B K x N, row-major), nt (B stored N x K, as torch's linear weight), tn, "
          "tt (A stored K x M)", "_{}"),
    # The type C is stored in; accumulation is fp32 in every case, and beta * C reads C in its type.
    # Its C++ codes are dtypes' storage codes, by which templates/check.cu reads an element.
    Field("out", _C_TYPES, "fp32", "the type C is stored in; accumulation is fp32", "_o{}", what="the type of C",
          cpp="GG_TYPE", codes=tuple((name, PRECISIONS[name].check_kind) for name in _C_TYPES)),
    # A vector of C's type: one value per row of C (M values) or per column (N values: nn.Linear's
    # bias, cuBLASLt's BIAS epilogue).
    Field("bias", ("none", "row", "col"), "none",
          "a vector of C's type added before the activation: row (M values, one per row of C), col (N values, one "
          "per column: nn.Linear's bias)", "_b{}"),
    # Applied last: ReLU (NaN stays NaN), GELU with the tanh approximation (torch's
    # gelu(approximate="tanh"), cuBLASLt's GELU), SiLU (x * sigmoid(x)).
    Field("act", ("none", "relu", "gelu", "silu"), "none", "applied last: relu, gelu (tanh approximation), silu",
          "_{}", what="the activation"),
    # One product per launch, or a strided batch: batch matrices of A, B and C (and bias vectors) at
    # constant element strides in one launch, as cublasGemmStridedBatchedEx takes them; the count
    # and the strides are launch arguments, not part of the kernel. --batch is the count, for the
    # commands that measure, so the mode's option is --batch-mode.
    Field("batch", ("none", "strided"), "none",
          "strided: a batch of products in one launch, the launcher taking the batch count and a stride per matrix "
          "(docs/problems.md)", "_{}", option="--batch-mode", words=(("strided", "batched"),)),
    # FP8's scales, fp32 values in device memory that the launcher takes after the bias: tensor
    # (scale_a[0] and scale_b[0] multiply every product), row (scale_a[i] row i of C, scale_b[j]
    # column j: torch._scaled_mm's row-wise scaling), block (1 x 128 blocks of A, 128 x 128 of B:
    # DeepSeek-V3's recipe); describe/scaling.py has the layouts. Last in a name, so earlier names stand.
    Field("scale", ("none", "tensor", "row", "block"), "none",
          "FP8's scales, fp32 in device memory after the bias: tensor (scale_a[0] * scale_b[0] multiplies A @ B), "
          "row (scale_a[i] row i of A @ B, scale_b[j] column j: M and N values), block (a scale per row of A and "
          "128 of K, and per 128 x 128 block of B: torch._scaled_mm's 1x128 and 128x128 layouts)", "_s{}",
          what="FP8's scaling"),
)
FIELD: dict[str, Field] = {f.key: f for f in FIELDS}
#: The keys that name a variant among a point's parameters (``--set trans=nt,out=bf16``).
VARIANT_KEYS = tuple(FIELD)
LAYOUTS = FIELD["trans"].choices
OUTPUTS = FIELD["out"].choices
BIASES = FIELD["bias"].choices
ACTIVATIONS = FIELD["act"].choices
BATCHES = FIELD["batch"].choices


def option_of(key: str) -> str:
    """The command-line option that gives variant key ``key`` (``--trans``, ``--batch-mode``)."""
    return FIELD[key].flag


@dataclass(frozen=True)
class Variant:
    """What a kernel computes beyond M, N, K: the layouts of A and B (``trans``), the type of C
    (``out``) and the epilogue (``bias``, ``act``):

        C = act(alpha * A @ B + beta * C + bias)

    with bias[i] added to row i of C (``row``) or bias[j] to column j (``col``); accumulation is
    fp32 and the sum is rounded to C's type once, after the activation. With ``batch="strided"``
    the kernel computes that for i < batch matrices at once (one launch):

        C[i] = act(alpha * A[i] @ B[i] + beta * C[i] + bias[i]),
        X[i] = X + i * stride_x  (strides in elements; 0 for A, B or bias: one shared by all)

    With ``scale`` (FP8), A @ B is scaled first, by fp32 values in device memory: ``tensor``
    multiplies it by scale_a[0] * scale_b[0], ``row`` element (i, j) by scale_a[i] * scale_b[j];
    ``block`` scales A's elements per row and 128 of K, B's per 128 x 128 block, before the sum
    over K (gemmgen.describe.scaling has the layouts).

    The attributes are FIELDS' keys, each defaulting to its field's default. The default (nn, fp32,
    no bias, no activation, not batched) is what every kernel computed before variants existed; a
    canonical name gains a key's part (``_<layout>``, ``_o<out>``, ``_b<bias>``, ``_<act>``,
    ``_batched``) only away from it, so every earlier name (and stored row) still means the same
    kernel.
    """

    trans: str = FIELD["trans"].default
    out: str = FIELD["out"].default
    bias: str = FIELD["bias"].default
    act: str = FIELD["act"].default
    batch: str = FIELD["batch"].default
    scale: str = FIELD["scale"].default

    def __post_init__(self):
        for f in FIELDS:
            f.check(getattr(self, f.key))

    @property
    def a_transposed(self) -> bool:
        """A is stored K x M (row-major), i.e. A is column-major."""
        return self.trans[0] == "t"

    @property
    def b_transposed(self) -> bool:
        """B is stored N x K (row-major), i.e. B is column-major (nn.Linear's weight)."""
        return self.trans[1] == "t"

    @property
    def has_epilogue(self) -> bool:
        """A bias or an activation is fused into the store."""
        return self.bias != FIELD["bias"].default or self.act != FIELD["act"].default

    @property
    def batched(self) -> bool:
        """A strided batch of products in one launch (the launcher takes batch and strides)."""
        return self.batch == "strided"

    @property
    def scaled(self) -> bool:
        """FP8 scales in device memory (the launcher takes scale_a and scale_b)."""
        return self.scale != FIELD["scale"].default

    def scale_lengths(self, m: int, n: int, k: int) -> tuple[int, ...]:
        """How many fp32 values scale_a and scale_b hold for an M x N x K product: (1, 1) for
        scale=tensor, (M, N) for row, (KB * M, ceil(N/128) * KBP) for block (gemmgen.describe.scaling);
        () where the variant is not scaled."""
        return scaling.lengths(self.scale, m, n, k)

    @property
    def out_type(self) -> str:
        """The CUDA type C (and the bias) is stored in: float, __half or __nv_bfloat16."""
        return PRECISIONS[self.out].c_type

    @property
    def fields(self) -> tuple[Field, ...]:
        """FIELDS, the table of the keys (for the templates, which see a Variant, not this module)."""
        return FIELDS

    def _pairs(self) -> tuple[tuple[Field, str], ...]:
        return tuple((f, getattr(self, f.key)) for f in FIELDS)

    @property
    def suffix(self) -> str:
        """The canonical name's variant part: empty for the default (gemmgen.describe.names reads it back)."""
        return "".join(f.name_text(value) for f, value in self._pairs())

    @property
    def items(self) -> tuple[tuple[str, str], ...]:
        """(key, value) pairs away from the default, as ``--set`` takes them."""
        return tuple((f.key, value) for f, value in self._pairs() if value != f.default)

    @property
    def text(self) -> str:
        """The values, space-separated: what an emitted launcher's ``<launcher>_variant`` returns.
        Four words (``nt bf16 col gelu``) for one product, as launchers said before batches; then
        ``strided`` for a batched launcher (``nn fp32 none none strided``), whose ABI takes batch and
        strides, and the scaling where there is one (``nt bf16 none none row``), whose ABI takes
        scale_a and scale_b."""
        return " ".join(value for f, value in self._pairs()
                        if (f.key != "batch" or self.batched) and (f.key != "scale" or self.scaled))

    @classmethod
    def parse(cls, text: str) -> "Variant":
        """The inverse of ``text``; two words (``nn fp32``, from launchers without an epilogue
        part) mean no bias and no activation, four no batch and no scaling; a fifth word is the
        batch mode or the scaling, whichever it names. Raises InvalidParameter."""
        words = text.split()
        if len(words) not in (2, 4, 5, 6):
            raise InvalidParameter(f"cannot read variant {text!r}: want 'TRANS OUT', 'TRANS OUT BIAS ACT', then "
                                   "BATCH and/or SCALE")
        if len(words) == 5 and words[4] not in BATCHES:
            words.insert(4, FIELD["batch"].default)
        return cls(*words)

    def a_dims(self, shape: "Shape") -> tuple[int, int]:
        """(rows, columns) of A as stored, row-major."""
        return (shape.k, shape.m) if self.a_transposed else (shape.m, shape.k)

    def b_dims(self, shape: "Shape") -> tuple[int, int]:
        """(rows, columns) of B as stored, row-major."""
        return (shape.n, shape.k) if self.b_transposed else (shape.k, shape.n)


def split_variant(params: dict) -> tuple[dict, Variant]:
    """``params`` without its variant keys (case-insensitive), and the Variant they name;
    raises InvalidParameter for a bad value."""
    rest, found = {}, {}
    for key, value in params.items():
        low = str(key).strip().lower()
        if low in FIELD:
            found[low] = str(value).strip().lower()
        else:
            rest[key] = value
    return rest, Variant(**found)


@dataclass(frozen=True)
class Variants:
    """The variants a family computes, declared once in its module (``Family.computes``): per
    variant key, the values it takes. Variants() is the default variant alone; EVERY_VARIANT every
    one, and ``EVERY_VARIANT.but(out=("fp32",))`` every one with C in fp32 only."""

    allowed: tuple[tuple[str, tuple[str, ...]], ...] = tuple((f.key, (f.default,)) for f in FIELDS)

    def but(self, **values: tuple[str, ...]) -> "Variants":
        """These variants, with the given keys taking only the given values."""
        for key, taken in values.items():
            for value in taken:
                FIELD[key].check(value)
        return Variants(tuple((key, tuple(values.get(key, taken))) for key, taken in self.allowed))

    def values(self, key: str) -> tuple[str, ...]:
        """The values of variant key ``key`` computed."""
        return dict(self.allowed)[key]

    def refused(self, variant: Variant) -> list[str]:
        """One line per key of ``variant`` whose value is not computed (``trans=nn only, not
        trans=nt``), for "family F computes ..."; [] where the variant is computed."""
        return [f"{key}={' or '.join(taken)} only, not {key}={getattr(variant, key)}" for key, taken in self.allowed
                if getattr(variant, key) not in taken]

    def __contains__(self, variant: Variant) -> bool:
        return not self.refused(variant)


EVERY_VARIANT = Variants(tuple((f.key, f.choices) for f in FIELDS))
