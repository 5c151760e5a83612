"""Named points: the kernels of the seed documents as points of gemmgen's families.

``v1``..``v6`` are the FastCuda guide's six versions with the parameters it gives; ``blog_*``
are the CUDA-007 blog's kernels; ``splitk``, ``mma_*`` and ``hopper_*`` are gemmgen's own. Where a
point differs from its seed's code, ``note`` says how; the README's table repeats it.
"""

from dataclasses import dataclass

from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.describe.config import DEFAULT_ARCH, KernelConfig, make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.names import parse_name
from gemmgen.describe.problem import Variant
from gemmgen.errors import InvalidParameter


@dataclass(frozen=True)
class NamedPoint:
    name: str
    family: str
    precision: str
    params: dict  # the family's parameters only
    source: str
    note: str = ""
    variant: Variant = Variant()  # what the point computes (hopper_e4m3: B stored N x K, bf16 C)

    def __post_init__(self):
        # Parameters the point leaves out (e.g. ones added to its family later) take the family's
        # defaults, so that ``params`` always names every parameter.
        object.__setattr__(self, "params", {**FAMILIES[self.family].defaults, **self.params})

    def config(self, arch: str | Arch = DEFAULT_ARCH) -> KernelConfig:
        return make_config(self.family, self.params, self.precision, arch, self.variant)

    def runs_on(self, arch: str | Arch) -> bool:
        """Whether the point's family can target ``arch`` at all (hopper: sm_90 only)."""
        return FAMILIES[self.family].runs_on((arch if isinstance(arch, Arch) else parse_arch(arch)).cc)


NAMED_POINTS: dict[str, NamedPoint] = {p.name: p for p in (
    NamedPoint("v1", "naive", "fp32", {"BX": 16, "BY": 16}, "FastCuda V1 (naive)"),
    NamedPoint("v2", "shared", "fp32", {"TILE": 32, "PAD": 1}, "FastCuda V2 (shared-memory tiles)"),
    NamedPoint("v3", "register", "fp32",
               {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "layout": "contig", "vec": 4, "PAD": 0},
               "FastCuda V3 (register blocking, float4)",
               "the guide does not say how a thread's 4x4 outputs are placed; gemmgen uses contiguous"),
    NamedPoint("v4", "warp", "fp32",
               {"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2},
               "FastCuda V4 (warp tiles, double buffer)",
               "the guide gives no warp tile; 64x32 makes 8 warps of 8x4 threads with 8x8 outputs each"),
    NamedPoint("v5", "wmma", "tf32",
               {"BM": 64, "BN": 64, "BK": 8, "WARPS_M": 4, "WARPS_N": 1, "PAD": 0},
               "FastCuda V5 (TF32 WMMA 16x16x8)"),
    NamedPoint("v6", "wmma", "fp16",
               {"BM": 64, "BN": 64, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "PAD": 8},
               "FastCuda V6 (FP16 WMMA 16x16x16)",
               "the guide gives 4 warps but not their layout; gemmgen uses 2x2 (32x32 per warp)"),
    NamedPoint("blog_naive", "naive", "fp32", {"BX": 16, "BY": 16}, "CUDA-007 gemm_naive",
               "the blog does not give its launch shape; 16x16 makes it the same kernel as v1"),
    NamedPoint("blog_tiling_v1", "shared", "fp32", {"TILE": 16, "PAD": 0}, "CUDA-007 gemm_block_tiling_v1",
               "the blog assumes M, N, K are multiples of 16; gemmgen guards the edges"),
    NamedPoint("blog_tiling_v2", "register", "fp32",
               {"BM": 64, "BN": 64, "BK": 64, "TM": 4, "TN": 4, "layout": "strided", "vec": 1, "PAD": 1},
               "CUDA-007 gemm_block_tiling_v2",
               "the blog loops k innermost (dot products); gemmgen's register family is an outer product"),
    NamedPoint("blog_tiling_v3", "register", "fp32",
               {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "layout": "strided", "vec": 1, "PAD": 0},
               "CUDA-007 gemm_block_tiling_v3",
               "the blog loops k innermost (dot products); gemmgen's register family is an outer product"),
    NamedPoint("blog_tiling_v4", "register", "fp32",
               {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "layout": "strided", "vec": 1, "PAD": 0},
               "CUDA-007 gemm_block_tiling_v4 (outer product)"),
    NamedPoint("fastgemm", "fastgemm", "fp32",
               {"BM": 24, "BN": 512, "BK": 8, "THREADS": 128, "AV": 24, "KC": 1, "preload": 1},
               "FastGeMM wiki kernel design ((m, n) = (24, 512), C tile in shared memory)",
               "the wiki leaves k open: BK=8; A's column is not contiguous in row-major A, so A's 24 x 8 tile "
               "is staged transposed in shared memory (50944 bytes in all, not 49152) and read as broadcast "
               "float4s; one block per 24 x 512 tile rather than one per SM"),
    NamedPoint("splitk", "warp", "fp32",
               {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 16, "TM": 2, "TN": 4, "buffers": 2,
                "split_k": 8, "swizzle": 1},
               "gemmgen: split-K for small M (16x4096x4096)",
               "not a seed kernel: at M=16 one 16-row tile spans C's rows, so the 4096-deep K range is split "
               "8 ways to give the GPU 512 blocks; the partial sums are added in split order (deterministic)"),
    NamedPoint("mma_fp16", "mma", "fp16",
               {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 5, "frags": 2},
               "gemmgen: mma.sync + ldmatrix + 5-stage cp.async, 64x64 warp tiles",
               "not a seed kernel: the best of the H100 tuning at 4096^3 (57% of cuBLAS); 80 KiB of shared "
               "memory, so it fits sm_86/sm_89"),
    NamedPoint("mma_bf16", "mma", "bf16",
               {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 5, "frags": 2},
               "gemmgen: mma_fp16's tiles for bf16"),
    NamedPoint("mma_tf32", "mma", "tf32",
               {"BM": 128, "BN": 128, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 4, "frags": 2},
               "gemmgen: mma.sync m16n8k8 tf32 on raw fp32 bits, 64x64 warp tiles",
               "not a seed kernel: the H100's best tf32 point (mma_128x256x16_w2x4_s5_f2_tf32) needs 120 KiB of "
               "shared memory; this one, about 7% slower there (196 against 209-211 TFLOP/s), fits the 99 KiB "
               "of sm_86/sm_89"),
    NamedPoint("hopper_fp16", "hopper", "fp16",
               {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1},
               "gemmgen: TMA + wgmma m64n256k16, two consumer warpgroups, 4-stage ring, persistent, half of C "
               "stored during the next tile",
               "not a seed kernel: the best of the H100 tuning at 4096^3 (tiles grouped 8 rows at a time), with "
               "overlap=1 (1.4% faster there, 0.6-1.1% at 8192^3 and 4096x11008x4096)"),
    NamedPoint("hopper_bf16", "hopper", "bf16",
               {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1},
               "gemmgen: hopper_fp16's tiles for bf16"),
    NamedPoint("hopper_e4m3", "hopper", "e4m3",
               {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "streamk": 1, "promote": 4},
               "gemmgen: FP8 E4M3 (wgmma m64n128k32), sums promoted to fp32 every 512 of K, A and B K-major "
               "(trans=nt), bf16 C",
               "not a seed kernel: FP8 as torch._scaled_mm takes it (B stored N x K), as accurate as its default "
               "(promotion)", Variant("nt", "bf16")),
    NamedPoint("hopper_e4m3_block", "hopper", "e4m3",
               {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "cluster": 2, "promote": 1},
               "gemmgen: FP8 E4M3 with block scales (1x128 of A, 128x128 of B: DeepSeek-V3's recipe), each k tile's "
               "sums scaled and added in fp32, k tiles in pairs, A and B K-major (trans=nt), bf16 C",
               "not a seed kernel: the best of benchmarks/fp8_block.py's candidates from 2048 tokens up on an H200 "
               "(0.80-0.84x cuBLASLt's block-scaled matmul)", Variant("nt", "bf16", scale="block")),
    NamedPoint("hopper_e4m3_thin", "hopper", "e4m3",
               {"BM": 16, "BN": 64, "consumers": 1, "stages": 16, "swap": 1, "promote": 16},
               "gemmgen: FP8 E4M3 for few tokens, C^T = B^T A^T in 16 x 64 tiles (wgmma m64n16k32), a ring of 16 "
               "stages, sums promoted every 2048 of K, A and B K-major (trans=nt), bf16 C",
               "not a seed kernel: the fastest point within FP8's error bound at 16 x 4096 x 14336 (Llama-3-8B's "
               "down_proj at 16 tokens) on an H200, 19.1 us where cuBLASLt took 19.9-20.2; a tune of e4m3 tries it "
               "among its first points, as it does every named point",
               Variant("nt", "bf16")),
    NamedPoint("hopper_tf32", "hopper", "tf32",
               {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2},
               "gemmgen: TMA + wgmma m64n128k8 tf32 computing C^T = B^T A^T, B^T fragments loaded into registers",
               "not a seed kernel: measured on an H200 against cuBLAS in the same process, 96% at 4096^3 and "
               "8192^3 and 114% at 4096x11008x4096"),
)}


def point_spec(name: str) -> tuple[str, str, dict]:
    """(family, precision, parameters) of a named point (``v4``) or a canonical name
    (``warp_128x128x8_w64x32_t8x8_b2_fp32``), not yet validated.

    Raises InvalidParameter when the name is neither.
    """
    key = name.strip()
    if key.lower() in NAMED_POINTS:
        point = NAMED_POINTS[key.lower()]
        return point.family, point.precision, {**point.params, **dict(point.variant.items)}
    parsed = parse_name(key)
    if parsed is not None:
        family, precision, params, variant = parsed
        return family.name, precision, {**params, **dict(variant.items)}
    raise InvalidParameter(
        f"unknown point {name!r}; named points: {', '.join(NAMED_POINTS)} "
        "(or a canonical name such as warp_128x128x8_w64x32_t8x8_b2_fp32; see `gemmgen list`)")


def resolve_point(name: str, arch: str | Arch = DEFAULT_ARCH) -> KernelConfig:
    """The validated KernelConfig of a named point or canonical name (see :func:`point_spec`).

    Raises InvalidParameter for an unknown name, InvalidPoint when it breaks a constraint.
    """
    family, precision, params = point_spec(name)
    return make_config(family, params, precision, arch)
