"""On the GPU (sm_80 or newer): batched strided GEMM (batch=strided) of the mma and warp families,
each emitted library called many times in one process over odd shapes (1x1x1, 17x33x9,
127x129x65, 257x255x1023), batch counts 1, 3 and 8, strides with padding between the matrices
and stride 0 (one A, B or bias for the whole batch), every layout, fp16/bf16 C, bias and
activation, split-K, misaligned pointers and beta = 0 into a NaN-poisoned C: every matrix of the
batch against its float64 reference, and the padding between C's matrices untouched. Also
batch = 0 (nothing written) and the launcher's refusals. (`bench --batch` against the
batched cuBLAS baselines: tests/test_gpu_measure_batched.py.)"""

import random

import numpy as np
import pytest
from conftest import build_all

from gemmgen import verify
from gemmgen.config import make_config
from gemmgen.problem import Shape

pytestmark = pytest.mark.gpu

BENCH_SEED = 5

SMALL_MMA = {"BM": 64, "BN": 64, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}
POINTS = {
    "mma_fp16_nn": ("mma", "fp16", {}),
    "mma_fp16_nt_ofp16_bcol_gelu": ("mma", "fp16", {**SMALL_MMA, "trans": "nt", "out": "fp16", "bias": "col",
                                                   "act": "gelu"}),
    "mma_bf16_tn_obf16_brow_relu_k4": ("mma", "bf16", {**SMALL_MMA, "trans": "tn", "out": "bf16", "bias": "row",
                                                      "act": "relu", "split_k": 4, "swizzle": 4}),
    "mma_bf16_tt_k2": ("mma", "bf16", {"trans": "tt", "split_k": 2}),
    "mma_tf32_nn_silu": ("mma", "tf32", {**SMALL_MMA, "BK": 16, "act": "silu"}),
    "mma_tf32_tn_ofp16_bcol_k8": ("mma", "tf32", {**SMALL_MMA, "BK": 16, "trans": "tn", "out": "fp16", "bias": "col",
                                                  "split_k": 8}),
    "mma_tf32_nt_obf16": ("mma", "tf32", {**SMALL_MMA, "BK": 16, "trans": "nt", "out": "bf16"}),
    "warp_nn": ("warp", "fp32", {}),
    "warp_nt_bcol_silu_k4": ("warp", "fp32", {"trans": "nt", "bias": "col", "act": "silu", "split_k": 4,
                                              "swizzle": 8}),
    "warp_tt_brow_gelu": ("warp", "fp32", {"trans": "tt", "bias": "row", "act": "gelu"}),
    "warp_tn_k16": ("warp", "fp32", {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 16, "TM": 2, "TN": 4,
                                     "buffers": 2, "split_k": 16, "trans": "tn"}),
}
SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 65), (257, 255, 1023), (64, 128, 256), (3, 1000, 17)]


def batched_calls(seed: int, count: int = 24) -> list[dict]:
    """``count`` batched calls as a user makes them: each of SHAPES at batch counts 1, 3 and 8, with
    padding (elements) between consecutive matrices of A, B, C and the bias (0: packed), stride 0
    for A, B or the bias now and then, a misaligned first pointer now and then, beta = 0 every
    other call."""
    rng = random.Random(seed)
    calls = []
    for i in range(count):
        m, n, k = SHAPES[i % len(SHAPES)]
        batch = (1, 3, 8)[i % 3]
        calls.append({
            "shape": (m, n, k), "batch": batch,
            "pad": tuple(rng.choice((0, 0, 1, 8, 13)) for _ in range(4)),  # A, B, C, bias
            "shared": tuple(rng.random() < 0.2 for _ in range(3)),  # stride 0 for A, B, bias
            "offset": tuple(rng.choice((0, 0, 0, 1)) for _ in range(3)),
            "alpha": (1.0, 1.25)[i % 2], "beta": (0.0, -0.75)[i % 2],
        })
    calls.insert(0, {"shape": (17, 33, 9), "batch": 0, "pad": (0,) * 4, "shared": (False,) * 3,
                     "offset": (0,) * 3, "alpha": 1.0, "beta": 0.0})
    return calls


def _upload(drv, host: np.ndarray, offset: int):
    buffer = drv.mem_alloc(host.nbytes + 16 * host.itemsize + 256)
    address = int(buffer) + offset * host.itemsize
    drv.memcpy_htod(address, np.ascontiguousarray(host))
    return buffer, address


def check_batched_call(bench, kernel, config, call, rng) -> None:
    """One batched launch of ``kernel`` as ``call`` (batched_calls) describes it; fails the test
    unless every matrix of the batch is within the tolerance of its float64 reference (bias and
    activation applied) and C's padding between matrices keeps its sentinel."""
    drv, variant, precision = bench.gpu.drv, config.variant, config.precision
    (m, n, k), batch = call["shape"], call["batch"]
    shape = Shape(m, n, k)
    a_dims, b_dims = variant.a_dims(shape), variant.b_dims(shape)
    pad_a, pad_b, pad_c, pad_bias = call["pad"]
    shared_a, shared_b, shared_bias = call["shared"]
    n_bias = {"row": m, "col": n}.get(variant.bias, 0)
    stride_a = 0 if shared_a else m * k + pad_a
    stride_b = 0 if shared_b else k * n + pad_b
    stride_c = m * n + pad_c
    stride_bias = 0 if shared_bias else n_bias + pad_bias
    count = max(batch, 1)

    def stack(rows, cols, prec, stride, fill):
        """The batch's matrices at ``stride`` elements from one another (one where stride is 0),
        the padding between them ``fill``; returns (flat host array, [matrices])."""
        mats = [verify.random_matrix(rng, rows, cols, prec) for _ in range(count if stride else 1)]
        flat = np.full((stride * (count - 1) + rows * cols) if stride else rows * cols, fill,
                       dtype=mats[0].dtype)
        for i, mat in enumerate(mats):
            flat[i * stride:i * stride + rows * cols] = mat.reshape(-1)
        return flat, mats

    a_flat, a_mats = stack(*a_dims, precision, stride_a, 0)
    b_flat, b_mats = stack(*b_dims, precision, stride_b, 0)
    sentinel = verify.random_matrix(rng, 1, 1, variant.out).reshape(-1)[0]
    c_flat, c_mats = stack(m, n, variant.out, stride_c, sentinel)
    c_start = c_flat.copy()
    if call["beta"] == 0.0:  # poison C's matrices (not the padding) with NaN
        poison = np.frombuffer(b"\xff" * c_flat.itemsize, dtype=c_flat.dtype)[0]
        for i in range(count):
            c_start[i * stride_c:i * stride_c + m * n] = poison
    hosts = [(a_flat, call["offset"][0]), (b_flat, call["offset"][1]), (c_start, call["offset"][2])]
    bias_mats = None
    if n_bias:
        bias_flat, bias_mats = stack(1, n_bias, variant.out, stride_bias, 0)
        hosts.append((bias_flat, call["offset"][2]))
    buffers = []
    try:
        for host, off in hosts:
            buffers.append(_upload(drv, host, off))
        pa, pb, pc = (address for _, address in buffers[:3])
        kernel.launch(m, n, k, call["alpha"], pa, pb, call["beta"], pc, bias=buffers[3][1] if n_bias else None,
                      batch=batch, strides=(stride_a, stride_b, stride_c, stride_bias))
        bench.gpu.synchronize()
        got = np.empty_like(c_start)
        drv.memcpy_dtoh(got, pc)
    finally:
        for buffer, _ in buffers:
            buffer.free()
    what = f"{m}x{n}x{k} batch={batch} strides={stride_a},{stride_b},{stride_c},{stride_bias} beta={call['beta']}"
    if batch == 0:
        assert got.tobytes() == c_start.tobytes(), f"{what}: batch 0 wrote C"
        return
    for i in range(batch):
        start = i * stride_c
        if i + 1 < batch:  # the padding after matrix i is untouched
            assert got[start + m * n:start + stride_c].tobytes() == c_start[start + m * n:start + stride_c].tobytes(), \
                f"{what}: matrix {i} wrote past its end"
        a64, b64 = verify.product_operands(verify.as_float64(a_mats[i if stride_a else 0], precision),
                                           verify.as_float64(b_mats[i if stride_b else 0], precision), variant)
        ref, scale = verify.host_reference(a64, b64, verify.as_float64(c_mats[i], variant.out), call["alpha"],
                                           call["beta"])
        if variant.has_epilogue:
            bias64 = verify.as_float64(bias_mats[i if stride_bias else 0], variant.out) if n_bias else None
            ref, scale = verify.epilogue(ref, scale, bias64, variant.bias, variant.act)
        c = got[start:start + m * n].reshape(m, n)
        verdict = verify.compare(verify.as_float64(c, variant.out), ref, scale, precision, k, variant.out, variant.act)
        assert verdict.ok, f"{what}: matrix {i}: {verdict.message}"


@pytest.fixture(scope="module")
def built(build_cache):
    configs = {key: make_config(f, {**params, "batch": "strided"}, p, "sm_90") for key, (f, p, params) in POINTS.items()}
    return build_all(configs)


@pytest.mark.parametrize("key", list(POINTS))
def test_a_batched_library_is_right_for_every_matrix_over_many_calls(bench, built, key):
    from gemmgen.runtime import Launcher

    config, result = built[key]
    assert result.ok, result.log
    kernel = Launcher(result.library)
    assert kernel.variant == config.variant
    rng = np.random.default_rng(sum(map(ord, key)))
    for call in batched_calls(sum(map(ord, key))):
        check_batched_call(bench, kernel, config, call, rng)


def test_the_launcher_refuses_a_bad_batch_on_the_gpu(bench, built):
    from gemmgen.runtime import Launcher, ShapeRefused

    config, result = built["mma_fp16_nn"]
    kernel = Launcher(result.library)
    with pytest.raises(ShapeRefused, match="batch must be >= 0"):
        kernel.launch(8, 8, 8, 1.0, 0, 0, 0.0, 0, batch=-1)
    with pytest.raises(ShapeRefused, match="C's matrices overlap"):
        kernel.launch(8, 8, 8, 1.0, 0, 0, 0.0, 0, batch=2, strides=(64, 64, 63))

