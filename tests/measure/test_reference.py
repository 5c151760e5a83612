"""The one float64 reference with the epilogue in C++ (templates/reference.cuh), which the GPU check
(templates/check.cu) and the harness include, against gemmgen/measure/verify.py's rule, without a GPU:
its functions are __host__ __device__, so a host program built by nvcc runs them here. And the
codes C++ reads them by (templates/vocab.cuh.j2) are gemmgen.describe.problem.FIELDS'."""

import re
import subprocess

import numpy as np
import pytest
from conftest import nvcc_compile

from gemmgen.codegen.render import environment, render_kernel
from gemmgen.describe import tolerance
from gemmgen.describe.config import make_config
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import FIELD, FIELDS, Variant
from gemmgen.measure import verify
from gemmgen.measure.gpucheck import check_source

# A host program: reads "n elem_tol act" then n lines "alpha prod absprod beta_c0 b c", prints each
# element's ref and scale, then the statistics (gg_ref_stats).
PROGRAM = """
#include <cstdio>
#include <cmath>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
{% include "vocab.cuh.j2" %}
{% include "reference.cuh" %}
int main()
{
    unsigned long long n;
    double elem_tol;
    int act;
    if (scanf("%llu %lf %d", &n, &elem_tol, &act) != 3)
        return 2;
    gg_ref_stats s;
    for (unsigned long long i = 0; i < n; ++i) {
        double alpha, prod, absprod, beta_c0, b, c;
        if (scanf("%lf %lf %lf %lf %lf %lf", &alpha, &prod, &absprod, &beta_c0, &b, &c) != 6)
            return 2;
        const gg_ref_expected e = gg_ref_element(alpha, prod, absprod, beta_c0, b, act);
        gg_ref_count(s, i, c, e, elem_tol);
        printf("%.17g %.17g\\n", e.ref, e.scale);
    }
    printf("%.17g %.17g %.17g %.17g %llu %llu %llu\\n", s.err2, s.ref2, s.scale2, s.worst, s.bad, s.nonfinite,
           s.first);
    return 0;
}
"""


@pytest.fixture(scope="module")
def reference_program(tmp_path_factory):
    source = environment().from_string(PROGRAM).render(fields=FIELDS, v=None)
    return nvcc_compile(source, tmp_path_factory.mktemp("reference") / "reference", None)


@pytest.mark.nvcc
@pytest.mark.parametrize("bias, act", [("none", "none"), ("row", "relu"), ("col", "gelu"), ("row", "silu")])
def test_the_cpp_reference_is_verify_py_rule(reference_program, bias, act):
    """ref and scale of every element (the product, beta * C0, the bias, the activation) and the
    statistics of a C with good, wrong and NaN elements, as verify.host_reference, epilogue and
    host_stats give them."""
    rng = np.random.default_rng(7)
    m, n, k, alpha, beta = 6, 5, 40, 1.25, -0.75
    a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    c0 = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    vec = rng.uniform(-1, 1, m if bias == "row" else n)
    ref, scale = verify.epilogue(*verify.host_reference(a, b, c0, alpha, beta), vec if bias != "none" else None,
                                 bias, act)
    elem_tol = tolerance.elementwise_tolerance("fp16", k, "fp16", act)
    c = ref + rng.uniform(-0.5, 0.5, (m, n)) * elem_tol * scale  # within the bound
    c[1, 2] = ref[1, 2] + 3 * elem_tol * scale[1, 2] + 1e-3  # over it
    c[4, 0] = np.nan
    bias_of = np.zeros((m, n)) if bias == "none" else np.broadcast_to(
        vec.reshape(-1, 1) if bias == "row" else vec.reshape(1, -1), (m, n))
    rows = [" ".join(repr(float(v)) for v in (alpha, p, q, beta * float(x), y, z))
            for p, q, x, y, z in zip((a @ b).ravel(), (np.abs(a) @ np.abs(b)).ravel(), c0.ravel(), bias_of.ravel(),
                                     c.ravel())]
    given = f"{m * n} {elem_tol!r} {FIELD['act'].code(act)}\n" + "\n".join(rows) + "\n"
    lines = subprocess.run([str(reference_program)], input=given, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    got = np.array([[float(x) for x in line.split()] for line in lines[:-1]])
    # the same to the last bits of the terms (where 1 + tanh(u) cancels, the libraries' tanh may differ in an ulp)
    assert np.all(np.abs(got[:, 0] - ref.ravel()) <= 1e-14 * scale.ravel())
    np.testing.assert_allclose(got[:, 1], scale.ravel(), rtol=1e-15)
    err2, ref2, scale2, worst, bad, nonfinite, first = lines[-1].split()
    want = verify.host_stats(c, ref, scale, "fp16", k, "fp16", act)
    assert (int(bad), int(nonfinite), int(first)) == (want.bad, want.nonfinite, 1 * n + 2) == (1, 1, 7)
    np.testing.assert_allclose([float(err2), float(ref2), float(scale2), float(worst)],
                               [want.err2, want.ref2, want.scale2, want.worst], rtol=1e-12)


def test_the_cpp_codes_are_the_field_tables():
    """Every C++ code the check kernels and templates read is a field's (FIELDS); the C types' are
    dtypes' storage codes, by which check.cu reads an element of A, B or C."""
    source = check_source()
    for f in FIELDS:
        members = re.search(rf"enum {f.cpp_type} : int {{ (.*) }};", source)[1].split(", ")
        assert members == [f"{f.cpp_name(value)} = {f.code(value)}" for value in f.choices]
    assert [FIELD["out"].code(o) for o in FIELD["out"].choices] == [PRECISIONS[o].check_kind for o in ("fp32", "fp16",
                                                                                                         "bf16")]
    assert PRECISIONS["tf32"].check_kind == FIELD["out"].code("fp32")  # tf32 inputs are fp32 in memory
    assert "{%" not in source and "{{" not in source and "constexpr gg_bias GG_BIAS" not in source  # no kernel's
    v = Variant("tn", "fp16", "row", "silu", "strided")
    kernel = render_kernel(make_config("mma", {}, "fp16", "sm_90", v), untrimmed=True)  # trimming drops codes it decided
    for f in FIELDS:
        assert f"constexpr {f.cpp_type} {f.cpp_const} = {f.cpp_name(getattr(v, f.key))};" in kernel
    assert "typedef __half gg_out;" in kernel and "constexpr bool GG_A_T = true;" in kernel


@pytest.mark.nvcc
def test_the_gpu_check_compiles(tmp_path):
    """templates/check.cu as gemmgen.measure.gpucheck builds it (PyCUDA compiles it on the GPU machine)."""
    nvcc_compile(check_source(), tmp_path / "check.o", "sm_90", "-c")
