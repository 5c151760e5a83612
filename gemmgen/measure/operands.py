"""The device buffers one shape, precision and variant is measured on (:class:`Operands`): A, B,
C, C0, the bias and FP8's scales, their random contents on the host and the device, and the float64 references
made of them once a check asks.
"""

import numpy as np

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Shape, Variant
from gemmgen.measure import verify
from gemmgen.measure.device import Gpu
from gemmgen.measure.gpucheck import References
from gemmgen.measure.launcher import packed_strides


KEEP_BYTES = 2 << 30  # host matrices HostMatrices keeps for the next shapes (a fill's layers: B, and A and C0)


class HostMatrices:
    """Random host matrices (verify.random_matrix) kept for the shapes measured next: a request for
    rows x cols of one precision and operand gets the first rows of the one kept for those columns
    where it has as many rows or more (a row-major prefix: contiguous, as random as the whole), and
    otherwise a fresh draw of that many rows, kept instead. So measuring one layer (N x K) at many
    token counts, as a fill does, draws B once and A and C0 once per new largest M, not at every
    shape (B of 4096 x 28672 bf16 takes a second or more on the host). At most ``keep_bytes`` are
    kept; the least recently used go first. The arrays handed out are views: read them, do not
    write them."""

    def __init__(self, rng: np.random.Generator, keep_bytes: int = KEEP_BYTES):
        self.rng, self.keep_bytes = rng, keep_bytes
        self._kept: dict[tuple, np.ndarray] = {}  # (cols, precision, operand) -> matrix, least recent first

    def matrix(self, rows: int, cols: int, precision: str, operand: str = "a") -> np.ndarray:
        """``rows`` x ``cols`` of ``operand`` ("a", "b" or "c": each kept apart; B's elements as
        verify.random_matrix makes them with operand="b", A's and C's as its "a")."""
        key = (cols, precision, operand)
        kept = self._kept.pop(key, None)
        if kept is None or kept.shape[0] < rows:
            kept = verify.random_matrix(self.rng, rows, cols, precision, "b" if operand == "b" else "a")
        self._kept[key] = kept  # now the most recent
        while len(self._kept) > 1 and sum(x.nbytes for x in self._kept.values()) > self.keep_bytes:
            self._kept.pop(next(iter(self._kept)))
        return kept[:rows]


class Operands:
    """Device buffers of one shape, precision and variant (A and B as stored: Variant.a_dims, b_dims; C and C0
    of type ``variant.out``; a bias vector of that type, M or N values, where the variant adds
    one; fp32 scale_a and scale_b, one value each or M and N, where it is scaled), with the host
    copies of their contents and, once a check asks for them, the float64 references of the
    product on the GPU.

    A batched variant's operands hold ``batch`` matrices of each (and bias vectors), packed one
    after another (``strides``: gemmgen.measure.launcher.packed_strides); the host copies stack them along
    the rows (A: batch * rows x columns). ``batch`` is 1 for a variant that is not batched
    (ValueError otherwise)."""

    def __init__(self, gpu: Gpu, shape: Shape, precision: str, variant: Variant = Variant(), batch: int = 1):
        if batch < 1 or (batch != 1 and not variant.batched):
            raise ValueError(f"batch {batch}: a batched variant takes a batch of 1 or more, any other a batch of 1")
        self.gpu, self.shape, self.precision, self.variant, self.batch = gpu, shape, precision, variant, batch
        esize = PRECISIONS[precision].bytes
        self.c_bytes = PRECISIONS[variant.out].bytes
        drv = gpu.drv
        m, n, k = shape.m, shape.n, shape.k
        #: (stride_a, stride_b, stride_c, stride_bias) in elements, as a batched launcher takes them
        self.strides = packed_strides(variant, m, n, k)
        self.a = drv.mem_alloc(batch * m * k * esize)
        self.b = drv.mem_alloc(batch * k * n * esize)
        self.c = drv.mem_alloc(batch * m * n * self.c_bytes)
        self.c0 = drv.mem_alloc(batch * m * n * self.c_bytes)
        self.bias_len = self.strides[3]  # M or N values (0: no bias)
        self.bias = drv.mem_alloc(batch * self.bias_len * self.c_bytes) if self.bias_len else None
        self.scale_lens = variant.scale_lengths(m, n, k)  # () where the variant is not scaled
        self.scale_bufs = tuple(drv.mem_alloc(4 * count) for count in self.scale_lens)
        self.host_a = self.host_b = self.host_c0 = self.host_bias = None
        self.host_scales: tuple[np.ndarray, ...] = ()
        self.cublas_verdict = None  # cuBLAS's check on these operands, once a kernel is timed against it
        self.references: References | None = None  # of the current contents (GpuChecker.references)

    @property
    def filled(self) -> bool:
        return self.host_a is not None

    @property
    def c_size(self) -> int:
        """Bytes of C (every matrix of the batch)."""
        return self.batch * self.shape.m * self.shape.n * self.c_bytes

    def fill(self, rng: np.random.Generator, matrices: HostMatrices | None = None) -> None:
        """Random A, B and C0 (uniform(-1, 1), never zeros), and scales (uniform(1/4, 4)), on the host
        and the device: A, B and C0 fresh, or from ``matrices`` (kept from earlier shapes)."""
        m, n, batch = self.shape.m, self.shape.n, self.batch
        (ra, ca), (rb, cb) = self.variant.a_dims(self.shape), self.variant.b_dims(self.shape)
        matrices = matrices or HostMatrices(rng, keep_bytes=0)
        self.host_a = matrices.matrix(batch * ra, ca, self.precision)
        self.host_b = matrices.matrix(batch * rb, cb, self.precision, "b")
        self.host_c0 = matrices.matrix(batch * m, n, self.variant.out, "c")
        drv = self.gpu.drv
        if self.bias is not None:
            self.host_bias = verify.random_matrix(rng, 1, batch * self.bias_len, self.variant.out)
            drv.memcpy_htod(self.bias, self.host_bias)
        self.host_scales = tuple(rng.uniform(0.25, 4.0, count).astype(np.float32) for count in self.scale_lens)
        for buf, host in zip(self.scale_bufs, self.host_scales):
            drv.memcpy_htod(buf, host)
        drv.memcpy_htod(self.a, self.host_a)
        drv.memcpy_htod(self.b, self.host_b)
        drv.memcpy_htod(self.c0, self.host_c0)
        self._drop_references()

    def reset_c(self, beta: float) -> None:
        """C = NaN everywhere when beta == 0 (unwritten elements then fail), else C = C0."""
        drv = self.gpu.drv
        if beta == 0.0:  # all-ones bits: NaN in fp32, fp16 and bf16
            drv.memset_d8(self.c, 0xFF, self.c_size)
        else:
            drv.memcpy_dtod(self.c, self.c0, self.c_size)

    def download_c(self) -> np.ndarray:
        """C as float64 (its values exactly): M x N, or batch x M x N for a batched variant."""
        m, n = self.shape.m, self.shape.n
        out = np.empty((self.batch, m, n), dtype=verify.host_dtype(self.variant.out))
        self.gpu.drv.memcpy_dtoh(out, self.c)
        return verify.as_float64(out if self.variant.batched else out[0], self.variant.out)

    def matrix(self, i: int) -> tuple[int, int, int | None]:
        """Device addresses of matrix ``i`` of the batch: (C, C0, the bias vector or None)."""
        m, n = self.shape.m, self.shape.n
        c_at = i * m * n * self.c_bytes
        bias = int(self.bias) + i * self.bias_len * self.c_bytes if self.bias is not None else None
        return int(self.c) + c_at, int(self.c0) + c_at, bias

    def _drop_references(self) -> None:
        self.cublas_verdict = None
        if self.references is not None:
            self.references.free()
            self.references = None

    @property
    def bias_address(self) -> int | None:
        """The bias vector's device address, or None where the variant adds none."""
        return int(self.bias) if self.bias is not None else None

    @property
    def scales(self) -> tuple[int, int] | None:
        """(scale_a, scale_b)'s device addresses, as a scaled launcher takes them; None unscaled."""
        return tuple(int(buf) for buf in self.scale_bufs) or None

    def free(self) -> None:
        self._drop_references()
        for buf in (self.a, self.b, self.c, self.c0, self.bias, *self.scale_bufs):
            if buf is not None:
                buf.free()
