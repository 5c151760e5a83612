"""Shapes: parsing, and the flops and bytes that bench divides by time. The problem variant: the
part it adds to a name, the text a launcher says it in, both read back, and its refusals."""

import pytest

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.names import variant_of
from gemmgen.describe.problem import Shape, Variant, parse_shape, split_variant
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


# ---- the problem variant ------------------------------------------------------------------------

@pytest.mark.parametrize("variant, suffix, text", [
    (Variant(), "", "nn fp32 none none"),
    (Variant("nt", "bf16"), "_nt_obf16", "nt bf16 none none"),
    (Variant("nt", "fp16", "row", "relu"), "_nt_ofp16_brow_relu", "nt fp16 row relu"),
    (Variant("tt", act="relu"), "_tt_relu", "tt fp32 none relu"),
    (Variant(batch="strided"), "_batched", "nn fp32 none none strided"),
    (Variant("tt", "fp16", "row", "silu", "strided"), "_tt_ofp16_brow_silu_batched", "tt fp16 row silu strided"),
    (Variant("nt", "bf16", scale="row"), "_nt_obf16_srow", "nt bf16 none none row"),
    (Variant("nt", "bf16", "col", scale="tensor"), "_nt_obf16_bcol_stensor", "nt bf16 col none tensor"),
    (Variant(batch="strided", scale="tensor"), "_batched_stensor", "nn fp32 none none strided tensor"),
])
def test_a_variants_name_part_and_launcher_text_read_back(variant, suffix, text):
    """A name gains a part only away from the default; a launcher says its variant in four words,
    then its batch mode where batched and its scaling where scaled. Both read back: a kernel's
    name and cuBLAS's (the canonical names of
    whole points: tests/describe/test_config.py)."""
    assert (variant.suffix, variant.text) == (suffix, text)
    assert Variant.parse(text) == variant
    assert variant_of(f"mma_128x128x32_w2x2_s3_f2_fp16{suffix}") == variant == variant_of(f"cublas_fp16{suffix}")


def test_older_launchers_texts_read_as_no_epilogue_and_no_batch():
    assert Variant.parse("nt fp16") == Variant("nt", "fp16")
    assert Variant.parse("nn fp32 none none") == Variant()


def test_the_variant_keys_come_out_of_a_points_parameters():
    assert split_variant({"batch": "Strided", "BM": 64, "trans": "nt"}) == ({"BM": 64}, Variant("nt", batch="strided"))


@pytest.mark.parametrize("make, message", [
    (lambda: Variant.parse("nn fp32 none"), "want 'TRANS OUT', 'TRANS OUT BIAS ACT', then BATCH and/or SCALE"),
    (lambda: Variant(trans="xy"), "trans='xy' is not allowed; trans must be one of: nn, nt, tn, tt"),
    (lambda: Variant(out="fp8"), "out='fp8' is not allowed; out (the type of C) must be one of: fp32, fp16, bf16"),
    (lambda: Variant(bias="both"), "bias='both' is not allowed; bias must be one of: none, row, col"),
    (lambda: Variant(act="tanh"), "act='tanh' is not allowed; act (the activation) must be one of: none, relu, gelu, silu"),
    (lambda: Variant(batch="loop"), "batch='loop' is not allowed; batch must be one of: none, strided"),
    (lambda: Variant.parse("nt bf16 none none strided col"), "scale='col' is not allowed; scale (FP8's scaling) must "
                                                              "be one of: none, tensor, row"),
], ids=["text", "trans", "out", "bias", "act", "batch", "scale"])
def test_a_variant_refuses_what_it_does_not_know_in_one_line(make, message):
    with pytest.raises(InvalidParameter) as err:
        make()
    assert message in str(err.value) and "\n" not in str(err.value)


# ---- the variant's vocabulary: one field table (gemmgen.describe.problem.FIELDS) --------------------------

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
    from gemmgen.describe.problem import FIELD, FIELDS
    from gemmgen.store.db import Kernel

    parser = argparse.ArgumentParser()
    add_variant_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for f in FIELDS:
        assert actions[f.key].choices == f.choices and actions[f.key].option_strings == [f.flag]
        assert actions[f.key].help == f"{f.help} (default {f.default})"
        assert Kernel.__table__.c[f.key].server_default.arg == f.default
    assert FIELD["batch"].flag == "--batch-mode"  # --batch is the batch count


def test_the_scales_lengths_follow_the_scaling():
    assert Variant(scale="row").scale_lengths(3, 5, 7) == (3, 5)
    assert Variant(scale="tensor").scale_lengths(3, 5, 7) == (1, 1)
    assert Variant().scale_lengths(3, 5, 7) == ()
    # block: KB = ceil(K/128) scales per row of A; per block of 128 columns of B, KB rounded up to 4
    assert Variant(scale="block").scale_lengths(3, 5, 7) == (3, 4)
    assert Variant(scale="block").scale_lengths(300, 257, 1025) == (9 * 300, 3 * 12)
