"""Problem shapes: M x N x K as typed on the command line."""

import re
from dataclasses import dataclass

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


# ---- the problem variant: operand layouts and the type of C ----------------------------------

#: Layouts of (A, B), as BLAS names them: "n" is the operand as gemmgen always took it (A: M x K,
#: B: K x N, both row-major), "t" the operand stored transposed (A stored K x M, B stored N x K,
#: row-major; that is, A or B column-major). "nt" is torch.nn.functional.linear's x @ W^T.
LAYOUTS = ("nn", "nt", "tn", "tt")
#: Types C can be stored in; accumulation is fp32 in every case, and beta * C reads C in its type.
OUTPUTS = ("fp32", "fp16", "bf16")
#: Bias vectors the epilogue can add: none, one value per row of C (M values) or per column of C
#: (N values: nn.Linear's bias, cuBLASLt's BIAS epilogue). The bias has C's type.
BIASES = ("none", "row", "col")
#: Activations the epilogue can apply last: ReLU (NaN stays NaN), GELU with the tanh approximation
#: (torch's gelu(approximate="tanh"), cuBLASLt's GELU), SiLU (x * sigmoid(x)).
ACTIVATIONS = ("none", "relu", "gelu", "silu")
#: How many products one launch computes: one (``none``), or a strided batch (``strided``): batch
#: matrices of A, B and C (and bias vectors) at constant element strides, all in one launch, as
#: cublasGemmStridedBatchedEx takes them. The count and strides are launch arguments, not part of
#: the kernel.
BATCHES = ("none", "strided")
#: The keys that name a variant among a point's parameters (``--set trans=nt,out=bf16``): "trans"
#: as in BLAS's transa/transb ("layout" is a parameter of the register family).
VARIANT_KEYS = ("trans", "out", "bias", "act", "batch")
#: The command-line option of each variant key where it is not --<key>: --batch is the batch count
#: (a number) of the commands that measure or rank, so the batch mode is --batch-mode.
OPTION_OF = {"batch": "batch-mode"}


def option_of(key: str) -> str:
    """The command-line option that gives variant key ``key`` (``--trans``, ``--batch-mode``)."""
    return f"--{OPTION_OF.get(key, key)}"


@dataclass(frozen=True)
class Variant:
    """What a kernel computes beyond M, N, K: the layouts of A and B (``trans``, one of LAYOUTS),
    the type of C (``out``) and the epilogue (``bias``, ``act``):

        C = act(alpha * A @ B + beta * C + bias)

    with bias[i] added to row i of C (``row``) or bias[j] to column j (``col``); accumulation is
    fp32 and the sum is rounded to C's type once, after the activation. With ``batch="strided"``
    the kernel computes that for i < batch matrices at once (one launch):

        C[i] = act(alpha * A[i] @ B[i] + beta * C[i] + bias[i]),
        X[i] = X + i * stride_x  (strides in elements; 0 for A, B or bias: one shared by all)

    The default (nn, fp32, no bias, no activation, not batched) is what every kernel computed
    before variants existed; a canonical name gains ``_<layout>``, ``_o<out>``, ``_b<bias>``,
    ``_<act>`` and ``_batched`` only away from it, so every earlier name (and stored row) still
    means the same kernel.
    """

    trans: str = "nn"
    out: str = "fp32"
    bias: str = "none"
    act: str = "none"
    batch: str = "none"

    def __post_init__(self):
        if self.trans not in LAYOUTS:
            raise InvalidParameter(f"trans={self.trans!r} is not allowed; trans must be one of: {', '.join(LAYOUTS)} "
                                   "(A then B; n: A is M x K and B is K x N, row-major; t: stored transposed)")
        if self.out not in OUTPUTS:
            raise InvalidParameter(f"out={self.out!r} is not allowed; out (the type of C) must be one of: "
                                   f"{', '.join(OUTPUTS)}")
        if self.bias not in BIASES:
            raise InvalidParameter(f"bias={self.bias!r} is not allowed; bias must be one of: {', '.join(BIASES)} "
                                   "(row: one value per row of C, M values; col: one per column, N values)")
        if self.act not in ACTIVATIONS:
            raise InvalidParameter(f"act={self.act!r} is not allowed; act (the activation) must be one of: "
                                   f"{', '.join(ACTIVATIONS)}")
        if self.batch not in BATCHES:
            raise InvalidParameter(f"batch={self.batch!r} is not allowed; batch must be one of: {', '.join(BATCHES)} "
                                   "(strided: many products in one launch, matrices at constant strides)")

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
        return self.bias != "none" or self.act != "none"

    @property
    def batched(self) -> bool:
        """A strided batch of products in one launch (the launcher takes batch and strides)."""
        return self.batch == "strided"

    @property
    def suffix(self) -> str:
        """The canonical name's variant part: empty for the default."""
        return (("" if self.trans == "nn" else f"_{self.trans}") + ("" if self.out == "fp32" else f"_o{self.out}")
                + ("" if self.bias == "none" else f"_b{self.bias}") + ("" if self.act == "none" else f"_{self.act}")
                + ("_batched" if self.batched else ""))

    @property
    def items(self) -> tuple[tuple[str, str], ...]:
        """(key, value) pairs away from the default, as ``--set`` takes them."""
        return tuple((k, getattr(self, k)) for k in VARIANT_KEYS if getattr(self, k) != _DEFAULTS[k])

    @property
    def text(self) -> str:
        """The values, space-separated: what an emitted launcher's ``<launcher>_variant`` returns.
        Four words (``nt bf16 col gelu``) for one product, as launchers said before batches; five
        for a batched launcher (``nn fp32 none none strided``), whose ABI takes batch and strides."""
        return " ".join(getattr(self, k) for k in VARIANT_KEYS if k != "batch" or self.batched)

    @classmethod
    def parse(cls, text: str) -> "Variant":
        """The inverse of ``text``; two words (``nn fp32``, from launchers without an epilogue
        part) mean no bias and no activation, four or two no batch. Raises InvalidParameter."""
        words = text.split()
        if len(words) not in (2, 4, 5):
            raise InvalidParameter(f"cannot read variant {text!r}: want 'TRANS OUT', 'TRANS OUT BIAS ACT' or "
                                   "'TRANS OUT BIAS ACT BATCH'")
        return cls(*words)

    def a_dims(self, shape: "Shape") -> tuple[int, int]:
        """(rows, columns) of A as stored, row-major."""
        return (shape.k, shape.m) if self.a_transposed else (shape.m, shape.k)

    def b_dims(self, shape: "Shape") -> tuple[int, int]:
        """(rows, columns) of B as stored, row-major."""
        return (shape.n, shape.k) if self.b_transposed else (shape.k, shape.n)


_DEFAULTS = {"trans": "nn", "out": "fp32", "bias": "none", "act": "none", "batch": "none"}


def split_variant(params: dict) -> tuple[dict, Variant]:
    """``params`` without its variant keys (case-insensitive), and the Variant they name;
    raises InvalidParameter for a bad value."""
    rest, found = {}, {}
    for key, value in params.items():
        low = str(key).strip().lower()
        if low in VARIANT_KEYS:
            found[low] = str(value).strip().lower()
        else:
            rest[key] = value
    return rest, Variant(**found)


#: The variant part of a canonical name, as a regular expression (after the precision).
VARIANT_PATTERN = (f"(?:_(?P<trans>{'|'.join(l for l in LAYOUTS if l != 'nn')}))?"
                   f"(?:_o(?P<out>{'|'.join(o for o in OUTPUTS if o != 'fp32')}))?"
                   f"(?:_b(?P<bias>{'|'.join(b for b in BIASES if b != 'none')}))?"
                   f"(?:_(?P<act>{'|'.join(a for a in ACTIVATIONS if a != 'none')}))?"
                   f"(?:_(?P<batch>batched))?")


def named_variant_keys(fields: dict) -> dict[str, str]:
    """The variant keys a match of VARIANT_PATTERN found (its groupdict; other groups are left
    out), with the values Variant takes: the name's ``_batched`` is ``batch="strided"``."""
    return {k: ("strided" if k == "batch" else fields[k]) for k in VARIANT_KEYS if fields.get(k)}


_NAME_VARIANT = re.compile(f"_(?:{'|'.join(PRECISIONS)}){VARIANT_PATTERN}$")


def variant_of(name: str) -> Variant:
    """The variant a stored kernel's name (a canonical name, or cuBLAS's ``cublas_<precision>...``)
    says it computes: the part after its precision; (nn, fp32) where there is none."""
    found = _NAME_VARIANT.search(name)
    if found is None:
        return Variant()
    return Variant(**named_variant_keys(found.groupdict()))
