"""FP8's scale layouts (gemmgen.describe.scaling): the element-wise scales of A and B that the
references multiply by, against the blocks written out by hand, and the same rule over the
operands as stored (what the GPU check reads)."""

import numpy as np
import pytest

from gemmgen.describe import scaling


def test_block_scales_expand_to_their_1x128_and_128x128_blocks():
    m, n, k = 5, 300, 260  # KB = 3 blocks of K (the last of 4), KBP = 4; 3 blocks of N (the last of 44)
    sa = np.arange(3 * m, dtype=np.float32) + 1  # scale_a[kb * M + i]
    sb = np.arange(3 * 4, dtype=np.float32) + 100  # scale_b[nb * 4 + kb]; kb = 3 is padding
    big_a, big_b = scaling.expand("block", sa, sb, m, n, k)
    assert big_a.shape == (m, k) and big_b.shape == (k, n)
    for i, kk in ((0, 0), (4, 127), (4, 128), (2, 259)):
        assert big_a[i, kk] == sa[kk // 128 * m + i]
    for kk, j in ((0, 0), (127, 127), (128, 128), (259, 299), (200, 256)):
        assert big_b[kk, j] == sb[j // 128 * 4 + kk // 128]
    assert 103 not in big_b and 107 not in big_b  # the padding (kb = 3) is never read


@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_the_scaled_product_is_the_product_of_the_scaled_operands(scale):
    """A @ B under each scaling, summed block by block as a kernel does, equals (A * SA) @ (B * SB)."""
    rng = np.random.default_rng(1)
    m, n, k = 7, 260, 300
    a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    sa, sb = (rng.uniform(0.25, 4, count) for count in scaling.lengths(scale, m, n, k))
    big_a, big_b = scaling.expand(scale, sa, sb, m, n, k)
    want = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            if scale == "tensor":
                want[i, j] = sa[0] * sb[0] * a[i] @ b[:, j]
            elif scale == "row":
                want[i, j] = sa[i] * sb[j] * a[i] @ b[:, j]
            else:
                kbp = scaling.k_blocks_padded(k)
                want[i, j] = sum(sa[kb * m + i] * sb[j // 128 * kbp + kb] * a[i, kb * 128:(kb + 1) * 128]
                                 @ b[kb * 128:(kb + 1) * 128, j] for kb in range(scaling.blocks(k)))
    np.testing.assert_allclose((a * big_a) @ (b * big_b), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("operand, transposed", [("a", False), ("a", True), ("b", False), ("b", True)])
@pytest.mark.parametrize("scale", ["row", "block"])
def test_stored_terms_give_each_stored_element_its_scale(scale, operand, transposed):
    """gg_to_f64's rule (templates/check.cu) over an operand as stored reads the scale expand gives
    its logical element."""
    m, n, k = 6, 259, 270
    sa, sb = (np.arange(count, dtype=np.float64) for count in scaling.lengths(scale, m, n, k))
    big = scaling.expand(scale, sa, sb, m, n, k)[operand == "b"]
    logical = big.T if transposed else big
    rdiv, rmul, cdiv, cmul = scaling.stored_terms(scale, operand, m, n, k, transposed)
    values = sa if operand == "a" else sb
    rows, cols = logical.shape
    stored = np.array([[values[r // rdiv * rmul + c // cdiv * cmul] for c in range(cols)] for r in range(rows)])
    np.testing.assert_array_equal(stored, logical)
