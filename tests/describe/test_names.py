"""Canonical names (gemmgen.describe.names): built and read back in one place. The one round-trip test of
the parse-back, and the variant part of stored names (cuBLAS's included)."""

import random

import pytest

from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.names import kernel_name, parse_name, variant_of
from gemmgen.describe.points import NAMED_POINTS, point_spec, resolve_point
from gemmgen.describe.problem import FIELDS, Variant
from gemmgen.errors import InvalidPoint


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_points_round_trip_through_their_canonical_names(family):
    """The family's named points and points drawn at random, half of them in a variant drawn at
    random (every key of gemmgen.describe.problem.FIELDS), read back from their canonical names as the same
    family, precision, parameters and variant, and resolved to the same point."""
    fam = FAMILIES[family]
    rng = random.Random(1234)
    named = [resolve_point(p, "sm_90") for p in sorted(NAMED_POINTS) if NAMED_POINTS[p].family == family]
    configs = []
    for _ in range(3000):
        params = {p.name: rng.choice(p.choices) for p in fam.params}
        variant = Variant(**{f.key: rng.choice(f.choices) for f in FIELDS}) if rng.random() < 0.5 else Variant()
        try:
            configs.append(make_config(fam, params, rng.choice(fam.precisions), "sm_90", variant))
        except InvalidPoint:
            continue
    for config in named + configs:
        assert config.name == kernel_name(config.family, config.params, config.precision, config.variant)
        assert parse_name(config.name) == (config.family, config.precision,
                                           {k: str(v) for k, v in config.params.items()}, config.variant)
        assert variant_of(config.name) == config.variant
        assert resolve_point(config.name, "sm_90") == config
    assert len(configs) >= 5
    if family in ("hopper", "mma", "warp"):  # families that compute other variants: some were drawn
        assert any(config.variant.suffix for config in configs)


def test_the_variant_part_is_each_key_away_from_its_default_in_fields_order():
    v = Variant("nt", "bf16", "col", "gelu", "strided")
    assert v.suffix == "_nt_obf16_bcol_gelu_batched"
    assert variant_of(f"cublas_bf16{v.suffix}") == v
    assert variant_of("cublas_bf16_nt_obf16") == Variant("nt", "bf16")
    assert variant_of("register_64x64x16_t4x4_contig_v4_p0_fp32") == Variant()  # its 'layout' is a parameter
    # the parts have a fixed order: the name with two of them swapped is no name
    assert parse_name("warp_128x128x8_w64x32_t8x8_b2_fp32_bcol_nt") is None
    assert point_spec("warp_128x128x8_w64x32_t8x8_b2_fp32_nt_bcol")[2] == {
        "BM": "128", "BN": "128", "BK": "8", "WM": "64", "WN": "32", "TM": "8", "TN": "8", "buffers": "2",
        "split_k": "1", "swizzle": "1", "trans": "nt", "bias": "col"}
