"""Verification on the GPU. The float64 references of a set of operands -- the exact product of
its inputs and of their absolute values, by cuBLAS's dgemm -- are made once, on the GPU, and kept
there; each result C is then reduced there to :class:`gemmgen.measure.verify.Stats` (templates/check.cu,
with templates/reference.cuh: the float64 reference and epilogue the emitted harness uses too,
verify.py's rule) and judged by :func:`gemmgen.measure.verify.judge`: the checks and constants of
verify.compare, with a few numbers read back instead of M x N elements and their references.

Needs a GPU (PyCUDA, and nvcc once per process to build the check kernels).
"""

import numpy as np

from gemmgen.describe import scaling, tolerance
from gemmgen.describe.dtypes import FP8_FORMATS, PRECISIONS
from gemmgen.describe.problem import FIELD, FIELDS, Variant
from gemmgen.measure import verify

THREADS = 256
_OUT_WORDS = 7  # gg_compare's out: 3 doubles, 4 unsigned 64-bit words
_OUT_INIT = np.zeros(_OUT_WORDS, dtype=np.uint64)
_OUT_INIT[5] = np.iinfo(np.uint64).max  # the first failing element: none yet


class References:
    """prod = A @ B and absprod = |A| @ |B| in float64 (M x N, row-major) on the GPU; of a batch,
    ``batch`` such matrices one after another (``matrix`` gives one)."""

    def __init__(self, prod, absprod, matrix_elements: int = 0, owner: bool = True):
        self.prod, self.absprod = prod, absprod
        self._elements, self._owner = matrix_elements, owner

    def matrix(self, i: int) -> "References":
        """Matrix ``i``'s references (device addresses into these; freed with them)."""
        offset = 8 * self._elements * i
        return References(int(self.prod) + offset, int(self.absprod) + offset, self._elements, owner=False)

    def free(self) -> None:
        if self._owner:
            self.prod.free()
            self.absprod.free()


def check_source() -> str:
    """templates/check.cu as compiled: with the variant's codes (vocab.cuh.j2, no kernel's
    variant) and the shared float64 reference (reference.cuh) included."""
    from gemmgen.codegen.render import environment

    return environment().get_template("check.cu").render(fields=FIELDS, v=None,
                                                         e4m3_kind=FP8_FORMATS["e4m3"].check_kind,
                                                         e5m2_kind=FP8_FORMATS["e5m2"].check_kind)


class GpuChecker:
    """Makes references and judges results on the GPU of ``gpu`` (gemmgen.measure.device.Gpu), with
    ``cublas`` (gemmgen.measure.cublas.Cublas) for the float64 products."""

    def __init__(self, gpu, cublas):
        from pycuda.compiler import SourceModule

        self.gpu, self.cublas, drv = gpu, cublas, gpu.drv
        module = SourceModule(check_source(), no_extern_c=True)
        self._module = module
        self._to_f64 = module.get_function("gg_to_f64")
        self._to_f64.prepare("PiPqiPqqqqq")
        self._compare = module.get_function("gg_compare")
        self._compare.prepare("PiPPPdddqPPiqi")
        self._out = drv.mem_alloc(_OUT_WORDS * 8)
        self._blocks_max = 8 * gpu.info.sm_count

    def _grid(self, n: int) -> tuple[int, int, int]:
        return (max(1, min(-(-n // THREADS), self._blocks_max)), 1, 1)

    def references(self, a, b, m: int, n: int, k: int, precision: str, b_transposed: bool = False,
                   a_transposed: bool = False, batch: int = 1, scale: str = "none", scales=None) -> References:
        """The float64 products of device operands a (M x K; stored K x M where ``a_transposed``)
        and b (K x N; stored N x K where ``b_transposed``), stored as ``precision``'s inputs (fp32
        for tf32); with ``batch``, of that many packed matrices of each (References.matrix). With
        FP8's ``scale`` (Variant.scale), of A and B scaled by the fp32 device vectors ``scales`` =
        (scale_a, scale_b), each element by its scale (gemmgen.describe.scaling: one each, per row
        of A and column of B, or per block)."""
        drv = self.gpu.drv
        a_kind, b_kind = PRECISIONS[precision].check_kind, PRECISIONS[precision].b.check_kind
        if (scale != "none") != (scales is not None):
            raise ValueError(f"scale={scale}: pass its device vectors (scale_a, scale_b) as scales, and only then")
        # (scale, row div, row mul, column div, column mul) per operand as stored (gg_to_f64)
        a_scale, b_scale = (0, 1, 0, 1, 0), (0, 1, 0, 1, 0)
        if scales:
            a_scale = (int(scales[0]), *scaling.stored_terms(scale, "a", m, n, k, a_transposed))
            b_scale = (int(scales[1]), *scaling.stored_terms(scale, "b", m, n, k, b_transposed))
        a_cols, b_cols = (m if a_transposed else k), (k if b_transposed else n)
        a64, b64 = drv.mem_alloc(batch * m * k * 8), drv.mem_alloc(batch * k * n * 8)
        prod, absprod = drv.mem_alloc(batch * m * n * 8), drv.mem_alloc(batch * m * n * 8)
        try:
            for absolute, out in ((0, prod), (1, absprod)):
                for src, kind, dst, count, cols, (at, *terms) in ((a, a_kind, a64, batch * m * k, a_cols, a_scale),
                                                                   (b, b_kind, b64, batch * k * n, b_cols, b_scale)):
                    self._to_f64.prepared_call(self._grid(count), (THREADS, 1, 1), int(src), np.int32(kind), dst,
                                               np.int64(count), np.int32(absolute), np.uintp(at), np.int64(cols),
                                               *(np.int64(t) for t in terms))
                self.cublas.dgemm(m, n, k, int(a64), int(b64), int(out), b_transposed, a_transposed, batch)
            self.gpu.synchronize()
        except BaseException:
            prod.free()
            absprod.free()
            raise
        finally:
            a64.free()
            b64.free()
        return References(prod, absprod, m * n)

    def stats(self, c, refs: References, c0, m: int, n: int, k: int, alpha: float, beta: float,
              precision: str, variant: Variant = Variant(), bias=None) -> verify.Stats:
        """Stats of the device C (M x N, of type ``variant.out``) against act(alpha * prod + beta *
        C0 + bias) (C0 of the same type, not read where beta == 0; the device vector ``bias``, of
        that type too, where the variant adds one), as verify.host_stats computes them."""
        drv, count, out = self.gpu.drv, m * n, variant.out
        c_type = PRECISIONS[out]
        bias_mode = FIELD["bias"].code(variant.bias)
        if variant.bias != "none" and bias is None:
            raise ValueError(f"variant {variant.text} adds a bias: pass its device vector")
        drv.memcpy_htod(self._out, _OUT_INIT)
        self._compare.prepared_call(self._grid(count), (THREADS, 1, 1), int(c), np.int32(FIELD["out"].code(out)),
                                    int(refs.prod), int(refs.absprod), int(c0), float(alpha), float(beta),
                                    tolerance.elementwise_tolerance(precision, k, out, variant.act), np.int64(count),
                                    self._out, int(bias) if variant.bias != "none" else 0, np.int32(bias_mode),
                                    np.int64(n), np.int32(FIELD["act"].code(variant.act)))
        raw = np.empty(_OUT_WORDS, dtype=np.uint64)
        drv.memcpy_dtoh(raw, self._out)
        sums, words = raw[:3].view(np.float64), raw[3:]
        first_bad = None
        if int(words[2]) < count:
            i = int(words[2])
            storage = verify.host_dtype(out)
            got, product, start = np.empty(1, storage), np.empty(1, np.float64), np.zeros(1, storage)
            drv.memcpy_dtoh(got, int(c) + c_type.bytes * i)
            drv.memcpy_dtoh(product, int(refs.prod) + 8 * i)
            if beta != 0.0:
                drv.memcpy_dtoh(start, int(c0) + c_type.bytes * i)
            got_f, start_f = (float(verify.as_float64(x, out)[0]) for x in (got, start))
            expected = alpha * float(product[0]) + (beta * start_f if beta != 0.0 else 0.0)
            if variant.bias != "none":
                value = np.empty(1, storage)
                drv.memcpy_dtoh(value, int(bias) + c_type.bytes * (i // n if variant.bias == "row" else i % n))
                expected += float(verify.as_float64(value, out)[0])
            expected = float(verify.activation(np.float64(expected), variant.act))
            first_bad = (i // n, i % n, got_f, expected)
        worst = float(words[3:4].view(np.float64)[0])
        return verify.Stats(float(sums[0]), float(sums[1]), float(sums[2]), int(words[0]), int(words[1]), worst,
                            first_bad)

    def close(self) -> None:
        self._out.free()
