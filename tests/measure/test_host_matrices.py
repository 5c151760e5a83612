"""gemmgen.measure.operands.HostMatrices without a GPU: a layer's random matrices drawn once and
reused as row prefixes, kept apart by operand, within a byte budget."""
import numpy as np

from gemmgen.measure import verify
from gemmgen.measure.operands import HostMatrices


def test_a_shape_with_fewer_rows_gets_the_first_rows_of_the_one_kept():
    m = HostMatrices(np.random.default_rng(1))
    big = m.matrix(300, 64, "bf16")
    small = m.matrix(17, 64, "bf16")
    assert small.shape == (17, 64) and np.shares_memory(small, big) and small.flags["C_CONTIGUOUS"]
    assert np.array_equal(small, big[:17])
    more = m.matrix(500, 64, "bf16")  # more rows than kept: drawn again, and kept instead
    assert more.shape == (500, 64) and not np.shares_memory(more, big)
    assert np.shares_memory(m.matrix(300, 64, "bf16"), more)


def test_operands_precisions_and_widths_are_kept_apart():
    m = HostMatrices(np.random.default_rng(2))
    a, b, c = m.matrix(8, 32, "fp16", "a"), m.matrix(8, 32, "fp16", "b"), m.matrix(8, 32, "fp16", "c")
    assert not np.shares_memory(a, b) and not np.shares_memory(a, c) and not np.shares_memory(b, c)
    assert not np.shares_memory(m.matrix(8, 32, "bf16"), a) and not np.shares_memory(m.matrix(8, 48, "fp16"), a)
    assert m.matrix(8, 32, "bf16").dtype == verify.host_dtype("bf16") == np.uint16
    # FP8 of two formats: B in its own format, as verify.random_matrix makes it with operand="b"
    assert m.matrix(4, 16, "e4m3e5m2", "b").dtype == verify.host_dtype("e4m3e5m2", "b")
    values = verify.as_float64(m.matrix(64, 64, "fp16", "c"), "fp16")
    assert np.all(np.abs(values) <= 1.0) and np.all(values != 0.0)


def test_the_least_recently_used_go_first_past_the_budget():
    m = HostMatrices(np.random.default_rng(3), keep_bytes=14000)  # 100 rows of fp32: 400 bytes a column
    first = m.matrix(100, 10, "fp32")
    m.matrix(100, 11, "fp32"), m.matrix(100, 12, "fp32")  # 13200 bytes
    assert np.shares_memory(m.matrix(100, 10, "fp32"), first)  # used again: now the most recent
    m.matrix(100, 13, "fp32")  # 18400 bytes: the 11 columns, least recently used, go
    assert sorted(key[0] for key in m._kept) == [10, 12, 13]
    assert np.shares_memory(m.matrix(50, 10, "fp32"), first)


def test_nothing_is_kept_with_no_budget_but_the_last():
    m = HostMatrices(np.random.default_rng(4), keep_bytes=0)
    a = m.matrix(10, 10, "fp32")
    b = m.matrix(10, 10, "fp32", "b")
    assert len(m._kept) == 1 and not np.shares_memory(a, b)
