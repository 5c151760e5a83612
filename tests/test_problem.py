"""Shapes: parsing, and the flops and bytes that bench divides by time."""

import pytest

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.problem import Shape, parse_shape
from gemmgen.errors import InvalidParameter
from gemmgen.measure.device import DeviceInfo


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


# ---- the variant's vocabulary: one field table (gemmgen.problem.FIELDS) --------------------------

def test_variant_is_the_field_table():
    """Variant's attributes are FIELDS' keys in order, each defaulting to its field's default, and
    each checked against its field's choices with a message that names them."""
    from dataclasses import fields

    from gemmgen.describe.problem import FIELDS, VARIANT_KEYS, Variant

    assert tuple(f.name for f in fields(Variant)) == VARIANT_KEYS == tuple(f.key for f in FIELDS)
    assert Variant() == Variant(**{f.key: f.default for f in FIELDS})
    assert Variant().items == () and Variant().suffix == ""
    for f in FIELDS:
        for value in f.choices:
            assert getattr(Variant(**{f.key: value}), f.key) == value
        with pytest.raises(InvalidParameter, match=f"^{f.key}='x' is not allowed; {f.key}.* must be one of: "
                                                   f"{', '.join(f.choices)} "):
            Variant(**{f.key: "x"})


def test_the_cli_and_the_database_take_choices_and_defaults_from_the_table():
    import argparse

    from gemmgen.cli.args import add_variant_arguments
    from gemmgen.describe.problem import FIELDS
    from gemmgen.store.db import Kernel

    parser = argparse.ArgumentParser()
    add_variant_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for f in FIELDS:
        assert actions[f.key].choices == f.choices and actions[f.key].option_strings == [f.flag]
        assert actions[f.key].help == f"{f.help} (default {f.default})"
        assert Kernel.__table__.c[f.key].server_default.arg == f.default
    assert FIELDS[-1].flag == "--batch-mode"  # --batch is the batch count
