"""Points: parameter parsing, precision, canonical names (parsed back: tests/test_names.py), named points,
constraints, geometry.

Expected numbers here are worked out by hand from the family declarations (gemmgen/families/)
and the FastCuda guide, not copied from gemmgen's output.
"""

import pytest

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import KernelConfig, make_config, parse_assignments
from gemmgen.describe.families import FAMILIES, get_family
from gemmgen.describe.points import NAMED_POINTS, point_spec, resolve_point
from gemmgen.errors import GemmgenError, InvalidParameter, InvalidPoint

ARCHS = ("sm_80", "sm_89", "sm_90")
SM89_SMEM = 99 * 1024  # 101376 bytes
SM90_SMEM = 227 * 1024  # 232448 bytes


# ---- parameter parsing --------------------------------------------------------------------------

def test_command_line_strings_become_ints():
    config = make_config("warp", {"BM": "64", "bn": " 64 ", "WM": "32", "WN": "32", "TM": "4", "TN": "8"})
    assert config.params == {"BM": 64, "BN": 64, "BK": 8, "WM": 32, "WN": 32, "TM": 4, "TN": 8, "buffers": 2,
                             "split_k": 1, "swizzle": 1}
    assert all(type(v) is int for v in config.params.values())


def test_word_parameters_are_case_insensitive():
    config = make_config("register", {"LAYOUT": " Strided ", "Vec": "1"})
    assert config.params["layout"] == "strided"
    assert config.params["vec"] == 1


def test_unset_parameters_take_the_family_defaults():
    fam = get_family("warp")
    config = make_config("warp", {"BK": 16})
    assert config.params == {**fam.defaults, "BK": 16}
    assert [name for name, _ in config.values] == [p.name for p in fam.params]


@pytest.mark.parametrize("raw", ["100", "abc", "", "12.5", "0x40", 100, 64.0, True])
def test_a_value_outside_the_allowed_set_lists_the_allowed_values(raw):
    with pytest.raises(InvalidParameter) as err:
        make_config("warp", {"BM": raw})
    assert "BM=" in str(err.value)
    assert "BM must be one of: 16, 32, 64, 128, 256" in str(err.value)


def test_a_word_parameter_rejects_numbers_and_other_words():
    for raw in (4, "diagonal"):
        with pytest.raises(InvalidParameter, match="layout must be one of: contig, strided"):
            make_config("register", {"layout": raw})


def test_an_unknown_parameter_lists_the_family_parameters():
    with pytest.raises(InvalidParameter) as err:
        make_config("warp", {"BQ": 64})
    message = str(err.value)
    assert "'BQ'" in message
    assert "BM, BN, BK, WM, WN, TM, TN, buffers" in message


def test_an_unknown_family_lists_the_families():
    with pytest.raises(InvalidParameter) as err:
        make_config("tensor")
    assert "'tensor'" in str(err.value)
    assert "naive, shared, register, warp, wmma" in str(err.value)


def test_parameter_errors_are_gemmgen_errors():
    assert issubclass(InvalidParameter, GemmgenError)
    assert issubclass(InvalidPoint, GemmgenError)


# ---- precision ----------------------------------------------------------------------------------

def test_precision_defaults_to_the_family_first_and_is_case_insensitive():
    assert make_config("warp").precision == "fp32"
    assert make_config("wmma").precision == "tf32"
    assert make_config("wmma", precision=" FP16 ").precision == "fp16"


@pytest.mark.parametrize("family, precision, allowed", [
    ("warp", "fp16", "allowed: fp32"),
    ("wmma", "fp32", "allowed: tf32, fp16, bf16"),
    ("wmma", "fp64", "allowed: tf32, fp16, bf16"),
])
def test_a_precision_the_family_does_not_take(family, precision, allowed):
    with pytest.raises(InvalidParameter) as err:
        make_config(family, precision=precision)
    assert repr(precision) in str(err.value)
    assert allowed in str(err.value)


def test_element_types():
    assert make_config("warp").element_type == "float"
    assert make_config("wmma", precision="tf32").element_type == "float"
    assert make_config("wmma", precision="fp16").element_type == "__half"
    assert make_config("wmma", precision="bf16").element_type == "__nv_bfloat16"


# ---- canonical names ----------------------------------------------------------------------------

CANONICAL = {
    "v1": "naive_b16x16_fp32",
    "v2": "shared_t32_p1_fp32",
    "v3": "register_64x64x16_t4x4_contig_v4_p0_fp32",
    "v4": "warp_128x128x8_w64x32_t8x8_b2_fp32",
    "v5": "wmma_64x64x8_w4x1_p0_tf32",
    "v6": "wmma_64x64x16_w2x2_p8_fp16",
}


@pytest.mark.parametrize("point", sorted(CANONICAL))
def test_canonical_names(point):
    for arch in ARCHS:  # the target is not part of the name
        assert resolve_point(point, arch).name == CANONICAL[point]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_name_encodes_every_parameter_and_the_precision(family):
    fam = FAMILIES[family]
    arch = parse_arch("sm_90")
    base = KernelConfig(fam, fam.precisions[0], arch, tuple(fam.defaults.items()))
    names = {base.name}
    for p in fam.params:
        for choice in p.choices:
            if choice != fam.defaults[p.name]:
                values = tuple((n, choice if n == p.name else v) for n, v in fam.defaults.items())
                names.add(KernelConfig(fam, fam.precisions[0], arch, values).name)
    assert len(names) == 1 + sum(len(p.choices) - 1 for p in fam.params)
    precisions = {KernelConfig(fam, prec, arch, base.values).name for prec in fam.precisions}
    assert len(precisions) == len(fam.precisions)


def test_named_points_are_case_insensitive_and_unknown_names_list_them():
    assert point_spec(" V4 ") == point_spec("v4")
    with pytest.raises(InvalidParameter) as err:
        point_spec("v7")
    assert "'v7'" in str(err.value)
    assert ", ".join(NAMED_POINTS) in str(err.value)


def test_a_canonical_name_with_a_bad_value_is_an_invalid_parameter():
    with pytest.raises(InvalidParameter, match="buffers must be one of: 1, 2"):
        resolve_point("warp_128x128x8_w64x32_t8x8_b3_fp32")
    with pytest.raises(InvalidParameter, match="does not take precision 'fp64'"):
        resolve_point("warp_128x128x8_w64x32_t8x8_b2_fp64")


# ---- the FastCuda guide's points ----------------------------------------------------------------

@pytest.mark.parametrize("point, family, precision, params, block", [
    ("v1", "naive", "fp32", {"BX": 16, "BY": 16}, (16, 16, 1)),
    ("v2", "shared", "fp32", {"TILE": 32, "PAD": 1}, (32, 32, 1)),
    ("v3", "register", "fp32", {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "vec": 4}, (256, 1, 1)),
    ("v4", "warp", "fp32", {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "buffers": 2}, (256, 1, 1)),
    ("v5", "wmma", "tf32", {"BM": 64, "BN": 64, "BK": 8}, (128, 1, 1)),  # 4 warps
    ("v6", "wmma", "fp16", {"BM": 64, "BN": 64, "BK": 16, "PAD": 8}, (128, 1, 1)),  # 4 warps
])
def test_named_points_carry_the_fastcuda_guide_parameters(point, family, precision, params, block):
    config = resolve_point(point)
    assert config.family.name == family
    assert config.precision == precision
    assert {k: config.params[k] for k in params} == params
    assert config.geometry.block == block


def test_fastcuda_wmma_points_use_the_guide_fragments():
    v5, v6 = resolve_point("v5"), resolve_point("v6")
    assert v5.params["WARPS_M"] * v5.params["WARPS_N"] == 4
    assert v6.params["WARPS_M"] * v6.params["WARPS_N"] == 4
    assert v5.derived["FRAG_K"] == 8  # 16x16x8 tf32
    assert v6.derived["FRAG_K"] == 16  # 16x16x16 fp16


@pytest.mark.parametrize("point", sorted(NAMED_POINTS))
def test_every_named_point_is_valid_on_every_target_its_family_runs_on(point):
    """Ampere, Ada and Hopper for every family but the sm_90-only hopper, which the others refuse."""
    family = FAMILIES[NAMED_POINTS[point].family]
    for arch in ARCHS:
        if family.runs_on(parse_arch(arch).cc):
            assert resolve_point(point, arch).arch.name == arch
        else:
            with pytest.raises(InvalidPoint, match=f"family {family.name} runs on sm_90 only"):
                resolve_point(point, arch)
    assert any(family.runs_on(parse_arch(arch).cc) for arch in ARCHS)


# ---- constraints --------------------------------------------------------------------------------

def test_every_violated_constraint_is_listed_with_its_values():
    params = {"BM": 32, "BN": 32, "WM": 64, "WN": 64, "TM": 2, "TN": 2}
    with pytest.raises(InvalidPoint) as err:
        make_config("warp", params)
    violations = err.value.violations
    assert len(violations) == 3
    assert any("BM=32" in v and "WM=64" in v for v in violations)
    assert any("BN=32" in v and "WN=64" in v for v in violations)
    # 32 / 2 = 32 thread rows times 32 thread columns = 1024 threads for a 32-thread warp
    assert any("1024" in v and "must be 32" in v for v in violations)
    message = str(err.value)
    assert err.value.name == "warp_32x32x8_w64x64_t2x2_b2_fp32"
    assert "3 constraint(s) violated" in message
    assert [line for line in message.splitlines() if line.startswith("  - ")] == [f"  - {v}" for v in violations]


def test_threads_shared_memory_and_warp_shape_are_all_reported():
    # 16 x 32 warps of 32 threads = 16384 threads; (16/2) * (8/4) = 16 threads per warp tile;
    # shared memory 2 buffers * (32 * (256 + 4) + 32 * 256) floats * 4 bytes = 132096 bytes.
    params = {"BM": 256, "BN": 256, "BK": 32, "WM": 16, "WN": 8, "TM": 2, "TN": 4, "buffers": 2}
    with pytest.raises(InvalidPoint) as err:
        make_config("warp", params, arch="sm_89")
    violations = err.value.violations
    assert len(violations) == 3
    assert any("= 16, must be 32" in v for v in violations)
    assert any("16384" in v and "1024" in v for v in violations)
    assert any("132096" in v and str(SM89_SMEM) in v and "sm_89" in v for v in violations)
    with pytest.raises(InvalidPoint) as err:  # Hopper has room for the shared memory
        make_config("warp", params, arch="sm_90")
    assert len(err.value.violations) == 2


def test_threads_per_block_over_1024():
    with pytest.raises(InvalidPoint) as err:
        make_config("naive", {"BX": 64, "BY": 32})
    assert err.value.violations == ["threads per block = 2048 exceeds 1024"]
    assert make_config("naive", {"BX": 1024, "BY": 1}).geometry.threads == 1024


def test_thread_tile_must_divide_warp_tile():
    params = {"BM": 64, "BN": 64, "WM": 8, "WN": 64, "TM": 16, "TN": 4}
    with pytest.raises(InvalidPoint) as err:
        make_config("warp", params)
    assert any("WM=8" in v and "TM=16" in v for v in err.value.violations)


def test_warp_tile_must_divide_block_tile():
    params = {"BM": 64, "BN": 64, "WM": 128, "WN": 32, "TM": 16, "TN": 2}
    with pytest.raises(InvalidPoint) as err:
        make_config("warp", params)
    assert any("BM=64" in v and "WM=128" in v for v in err.value.violations)


def test_big_wmma_tile_fits_hopper_but_not_ada():
    # C staging: BM * (BN + 4) floats = 128 * 260 * 4 = 133120 bytes, more than A and B's
    # (128 * 32 + 32 * 256) * 4 = 49152; sm_89 allows 101376 bytes per block, sm_90 232448.
    params = {"BM": 128, "BN": 256, "BK": 32, "WARPS_M": 4, "WARPS_N": 4, "PAD": 0}
    config = make_config("wmma", params, "tf32", "sm_90")
    assert config.geometry.smem_bytes == 133120
    assert make_config("wmma", params, "tf32", "sm_80").geometry.smem_bytes == 133120
    with pytest.raises(InvalidPoint) as err:
        make_config("wmma", params, "tf32", "sm_89")
    assert err.value.violations == [
        f"shared memory = 133120 bytes exceeds sm_89's limit of {SM89_SMEM} bytes per block"]


def test_wmma_tile_must_be_whole_fragments():
    with pytest.raises(InvalidPoint) as err:
        make_config("wmma", {"BM": 16, "WARPS_M": 2, "BK": 8, "PAD": 4}, "bf16", "sm_75")
    violations = err.value.violations
    assert len(violations) == 4
    assert any("BM=16" in v and "16*WARPS_M=32" in v for v in violations)
    assert any("BK=8" in v and "16" in v for v in violations)  # bf16 fragments are 16 deep
    assert any("PAD=4" in v and "8 bytes" in v for v in violations)  # 4 bf16 elements = 8 bytes
    assert "bf16 needs sm_80 or newer; target is sm_75" in violations
    # tf32 fragments are 8 deep, so BK=8 is whole there
    assert make_config("wmma", {"BK": 8, "PAD": 4}, "tf32", "sm_80").derived["FRAG_K"] == 8


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_tf32_and_bf16_need_ampere(precision):
    with pytest.raises(InvalidPoint) as err:
        make_config("wmma", {"BK": 16, "PAD": 8}, precision, "sm_75")
    assert err.value.violations == [f"{precision} needs sm_80 or newer; target is sm_75"]
    assert make_config("wmma", {"BK": 16, "PAD": 8}, precision, "sm_80").arch.cc == 80


def test_fp16_runs_on_volta_and_turing():
    for arch in ("sm_70", "sm_75"):
        assert make_config("wmma", {"BK": 16, "PAD": 8}, "fp16", arch).arch.name == arch


@pytest.mark.parametrize("text", ["sm_91", "sm_9", "gfx90a", "", "hopper"])
def test_unknown_arch_text_lists_the_known_architectures(text):
    with pytest.raises(InvalidParameter) as err:
        make_config("warp", arch=text)
    assert "unknown GPU architecture" in str(err.value)
    assert "sm_70, sm_75, sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_120" in str(err.value)


@pytest.mark.parametrize("text", ["sm_89", "sm89", "89", "8.9", "compute_89", " SM_89 "])
def test_arch_spellings(text):
    arch = parse_arch(text)
    assert (arch.cc, arch.name, arch.max_smem_per_block) == (89, "sm_89", SM89_SMEM)


def test_arch_specific_target_keeps_its_suffix():
    arch = parse_arch("sm_90a")
    assert (arch.cc, arch.suffix, arch.name, arch.max_smem_per_block) == (90, "a", "sm_90a", SM90_SMEM)
    with pytest.raises(InvalidParameter, match=r"'sm_89a': architecture-specific \('a'\) targets exist from sm_90a on"):
        parse_arch("sm_89a")


# ---- parse_assignments --------------------------------------------------------------------------

def test_parse_assignments():
    assert parse_assignments("BM=128,BN=64") == {"BM": "128", "BN": "64"}
    assert parse_assignments(" BM = 128 , layout=strided, ") == {"BM": "128", "layout": "strided"}
    with pytest.raises(InvalidParameter, match=r"--set ' , ' gives no NAME=VALUE pair"):
        parse_assignments(" , ")  # it would set nothing


@pytest.mark.parametrize("text, item", [("BM", "BM"), ("BM=128,BN", "BN"), ("BM=", "BM="), ("=128", "=128"),
                                        ("BM=128,BN=64,=", "=")])
def test_parse_assignments_errors_name_the_bad_item(text, item):
    with pytest.raises(InvalidParameter) as err:
        parse_assignments(text)
    assert repr(item) in str(err.value)
    assert "NAME=VALUE" in str(err.value)


# ---- geometry -----------------------------------------------------------------------------------

@pytest.mark.parametrize("point, threads, tile, smem", [
    ("v1", 256, (16, 16), 0),
    ("v2", 1024, (32, 32), 2 * 32 * 33 * 4),  # A and B tiles, rows padded to 33 floats
    ("v3", 256, (64, 64), (64 * 16 + 16 * 64) * 4),
    ("v4", 256, (128, 128), 2 * (8 * (128 + 4) + 8 * 128) * 4),  # two buffers, A transposed and padded by 4
    ("v5", 128, (64, 64), 64 * (64 + 4) * 4),  # the C staging tile is larger than A + B
    ("v6", 128, (64, 64), 64 * (64 + 4) * 4),
])
def test_geometry_of_the_fastcuda_points(point, threads, tile, smem):
    g = resolve_point(point).geometry
    assert g.threads == threads
    assert (g.tile_m, g.tile_n) == tile
    assert g.smem_bytes == smem


def test_configs_are_hashable_and_equal_by_value():
    a, b = resolve_point("v4"), resolve_point("warp_128x128x8_w64x32_t8x8_b2_fp32")
    assert a == b and len({a, b}) == 1


@pytest.mark.parametrize("raw", ["1_28", "+128", " 12 8", "128.0"])
def test_integer_parameters_take_plain_digits_only(raw):
    with pytest.raises(InvalidParameter):
        make_config("warp", {"BM": raw})


def test_wmma_accumulators_are_bounded():
    with pytest.raises(InvalidPoint) as err:
        make_config("wmma", {"BM": 256, "BN": 128, "WARPS_M": 1, "WARPS_N": 2}, "tf32", "sm_90")
    assert "512 registers" in str(err.value)
