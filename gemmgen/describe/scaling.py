"""FP8's scales (Variant.scale): how many fp32 values scale_a and scale_b hold, and which of them
scales which element of A and of B. The kernels, the launcher's checks, the float64 references
(host and GPU) and gemmgen.torch's checks all read these rules from here.

A scaled product is the product of the scaled operands: element (i, k) of A times its scale_a
value, element (k, j) of B times its scale_b value. In float64 these products are exact (an fp8
value has 4 significant bits, an fp32 scale 24), so a reference multiplies the operands first.

* ``tensor``: scale_a[0] and scale_b[0].
* ``row``: scale_a[i] (row i of A, M values) and scale_b[j] (column j of B, N values):
  torch._scaled_mm's row-wise scaling.
* ``block``: DeepSeek-V3's recipe, torch._scaled_mm's and cuBLASLt's layouts on Hopper. A in
  1 x 128 blocks along K: scale_a[kb * M + i] scales A(i, k) for kb = k / 128, that is KB x M
  values (KB = ceil(K / 128)), M contiguous -- torch's (M, KB) with strides (1, M). B in 128 x 128
  blocks: scale_b[nb * KBP + kb] scales B(k, j) for nb = j / 128, kb = k / 128, with KB rounded up
  to KBP, a multiple of 4 -- torch's (KBP, ceil(N / 128)) with strides (1, KBP); the padding is
  never read.
"""

BLOCK = 128  # elements of K (and of N, for B) that one block scale covers


def blocks(size: int) -> int:
    """The 128-element blocks of ``size`` elements: KB for K, and B's blocks of N."""
    return -(-size // BLOCK)


def k_blocks_padded(k: int) -> int:
    """KBP: KB rounded up to a multiple of 4, scale_b's stride between blocks of N (scale=block)."""
    return -(-blocks(k) // 4) * 4


def lengths(scale: str, m: int, n: int, k: int) -> tuple[int, ...]:
    """How many fp32 values scale_a and scale_b hold for an M x N x K product; () unscaled."""
    if scale == "tensor":
        return (1, 1)
    if scale == "row":
        return (m, n)
    if scale == "block":
        return (blocks(k) * m, blocks(n) * k_blocks_padded(k))
    return ()


def describe(scale: str) -> tuple[str, str]:
    """What scale_a and scale_b hold, in words (for messages and the emitted header)."""
    return {"tensor": ("one value", "one value"),
            "row": ("M values, one per row of A", "N values, one per column of B"),
            "block": ("ceil(K/128) x M values, one per row of A and 128 of K, M contiguous",
                      "ceil(N/128) x KBP values, one per 128 x 128 block of B, K's blocks contiguous "
                      "(KBP: ceil(K/128) rounded up to a multiple of 4)")}.get(scale, ("none", "none"))


def index_terms(scale: str, operand: str, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Which scale an element of ``operand`` ("a" or "b") reads, in its logical indices: for A
    (i, k) and for B (k, j), each index x contributes (x // div) * mul to the scale's index; returns
    ((div, mul) of the first index, (div, mul) of the second)."""
    if scale == "row":
        return ((1, 1), (1, 0)) if operand == "a" else ((1, 0), (1, 1))
    if scale == "block":
        return ((1, 1), (BLOCK, m)) if operand == "a" else ((BLOCK, 1), (BLOCK, k_blocks_padded(k)))
    return ((1, 0), (1, 0))


def stored_terms(scale: str, operand: str, m: int, n: int, k: int, transposed: bool) -> tuple[int, int, int, int]:
    """index_terms over the operand as stored, row-major: (row div, row mul, column div, column
    mul), where a transposed operand (A stored K x M, B stored N x K) has its indices swapped."""
    first, second = index_terms(scale, operand, m, n, k)
    rows, cols = (second, first) if transposed else (first, second)
    return (*rows, *cols)


def expand(scale: str, scale_a, scale_b, m: int, n: int, k: int):
    """(SA, SB): float64 matrices of each element's scale, M x K for A and K x N for B, from the
    host vectors scale_a and scale_b (numpy). A @ B scaled is (A * SA) @ (B * SB)."""
    import numpy as np

    out = []
    for operand, values, rows, cols in (("a", scale_a, m, k), ("b", scale_b, k, n)):
        (d0, m0), (d1, m1) = index_terms(scale, operand, m, n, k)
        index = np.add.outer(np.arange(rows) // d0 * m0, np.arange(cols) // d1 * m1)
        out.append(np.asarray(values, dtype=np.float64)[index])
    return tuple(out)
