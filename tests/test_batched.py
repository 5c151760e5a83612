"""Batched strided GEMM without a GPU: the variant key ``batch`` (names gain ``_batched`` only when
strided, launchers' variant texts of two, four and five words parse), and the families that do
not compute a strided batch refuse it in one line."""

import pytest

from gemmgen.config import make_config
from gemmgen.errors import InvalidParameter, InvalidPoint
from gemmgen.families import FAMILIES
from gemmgen.points import point_spec
from gemmgen.problem import VARIANT_KEYS, Variant, split_variant, variant_of

BATCHED = Variant(batch="strided")


def test_the_default_is_not_batched_and_names_keep_their_meaning():
    assert Variant().batch == "none" and not Variant().batched and Variant().suffix == ""
    assert Variant("nt", "bf16", "col", "gelu").suffix == "_nt_obf16_bcol_gelu"
    assert BATCHED.suffix == "_batched" and BATCHED.batched
    assert Variant("tt", "fp16", "row", "silu", "strided").suffix == "_tt_ofp16_brow_silu_batched"
    assert "batch" in VARIANT_KEYS and split_variant({"batch": "Strided", "BM": 64}) == ({"BM": 64}, BATCHED)


@pytest.mark.parametrize("variant", [BATCHED, Variant("nt", "bf16", batch="strided"),
                                     Variant("tn", "fp16", "col", "gelu", "strided"), Variant("tt", act="relu")])
def test_names_and_launcher_texts_read_back(variant):
    assert variant_of(f"mma_128x128x32_w2x2_s3_f2_fp16{variant.suffix}") == variant
    assert variant_of(f"cublas_fp16{variant.suffix}") == variant
    assert Variant.parse(variant.text) == variant
    assert len(variant.text.split()) == (5 if variant.batched else 4)


def test_older_launcher_texts_still_parse():
    assert Variant().text == "nn fp32 none none"  # one product: the four words launchers always said
    assert BATCHED.text == "nn fp32 none none strided"
    assert Variant.parse("nt fp16") == Variant("nt", "fp16")
    assert Variant.parse("nn fp32 none none") == Variant()
    with pytest.raises(InvalidParameter, match="TRANS OUT BIAS ACT BATCH"):
        Variant.parse("nn fp32 none")
    with pytest.raises(InvalidParameter, match="batch='loop' is not allowed; batch must be one of: none, strided"):
        Variant(batch="loop")


def test_a_canonical_name_with_batched_gives_its_point():
    family, precision, params = point_spec("warp_128x128x8_w64x32_t8x8_b2_fp32_nt_batched")
    assert (family, precision) == ("warp", "fp32") and params["trans"] == "nt" and params["batch"] == "strided"
    assert point_spec("warp_128x128x8_w64x32_t8x8_b2_fp32_nt")[2].get("batch") is None


@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if f not in ("mma", "warp")))
def test_families_without_a_batched_template_refuse_it_in_one_line(family):
    fam = FAMILIES[family]
    with pytest.raises(InvalidPoint) as caught:
        make_config(family, {"batch": "strided"}, fam.precisions[0], "sm_90")
    lines = [v for v in caught.value.violations if "batch" in v]
    assert lines == [f"family {family} computes one product per launch (batch=none only), not batch=strided"]
