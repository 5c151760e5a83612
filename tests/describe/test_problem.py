"""Shapes: parsing, and the flops and bytes that bench divides by time."""

import pytest

from gemmgen.errors import InvalidParameter
from gemmgen.problem import Shape, parse_shape
from gemmgen.runtime import DeviceInfo
from gemmgen.arch import parse_arch


def test_a_thin_product_moves_mostly_b():
    s = parse_shape("16x4096x4096")
    assert s.flops == 2 * 16 * 4096 * 4096
    # fp16 A (16 x 4096) and B (4096 x 4096) read once, fp32 C (16 x 4096) written once
    assert s.bytes_moved(2) == 16 * 4096 * 2 + 4096 * 4096 * 2 + 16 * 4096 * 4
    assert Shape(3, 5, 7).bytes_moved(4, c_bytes=2) == (21 + 35) * 4 + 15 * 2


def test_peak_bandwidth_from_the_memory_clock_and_bus():
    h100 = DeviceInfo("H100", parse_arch("90"), 132, 1980, 2619, "", "13.0", 50 << 20, memory_bus_bits=5120)
    assert h100.peak_bandwidth == pytest.approx(3.352e12, rel=1e-3)
    assert DeviceInfo("?", parse_arch("90"), 132, 1980, 0, "", "13.0", 0).peak_bandwidth is None


@pytest.mark.parametrize("text", ["0x4x4", "4x4", "-1", "4096x4096x2147483648"])
def test_bad_shapes_are_refused(text):
    with pytest.raises(InvalidParameter):
        parse_shape(text)
