"""The fastgemm family (the FastGeMM wiki's kernel design), GPU-free: its named point carries the
wiki's parameters, every constraint is reported with its values, points render, and they
compile with nvcc for sm_80 and sm_90 without spilling."""

import itertools
import re

import pytest
from conftest import FASTGEMM_POINTS as POINTS
from conftest import FASTGEMM_SEED as SEED
from conftest import assert_compiles_without_spills, build_all, nvcc_compile, slow_after

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.families import get_family
from gemmgen.describe.points import NAMED_POINTS, resolve_point
from gemmgen.errors import InvalidPoint
from gemmgen.tune.space import load_space

ARCHS = ("sm_80", "sm_90")


def violations_of(params, arch="sm_90"):
    with pytest.raises(InvalidPoint) as err:
        make_config("fastgemm", params, "fp32", arch)
    return err.value.violations


# ---- the named point ----------------------------------------------------------------------------

def test_named_point_carries_the_wiki_parameters():
    point = NAMED_POINTS["fastgemm"]
    assert point.family == "fastgemm" and point.precision == "fp32"
    config = resolve_point("fastgemm")
    assert {k: config.params[k] for k in SEED} == SEED
    assert config.name == "fastgemm_24x512x8_t128_a24_c1_p1_fp32"
    g, d = config.geometry, config.derived
    assert (g.tile_m, g.tile_n) == (24, 512)  # (m, n) per block
    assert g.block == (128, 1, 1)  # 4 warps: one per warp scheduler
    assert g.tile_m * g.tile_n == 49152 // 4  # the C tile fills the wiki's 48 KiB of shared memory
    assert d["GROUPS"] == 1 and d["TC"] == 128  # every thread shares the one A vector of 24 rows
    assert d["NB"] == 1  # 512 / (4 * 32 * 4) = 4 elements of b per thread: one float4
    # the C tile plus A's 24 x 8 tile (rows padded to 28 floats), double-buffered
    assert g.smem_bytes == (24 * 512 + 2 * 8 * 28) * 4 == 50944
    assert point.note  # the differences from the wiki are stated


def test_named_point_lies_in_the_search_space():
    space = load_space("fastgemm")
    for name, value in NAMED_POINTS["fastgemm"].params.items():
        assert value in space.params[name], f"{name}={value} not in {space.params[name]}"


@pytest.mark.parametrize("point", sorted(POINTS))
@pytest.mark.parametrize("arch", ("sm_80", "sm_89", "sm_90"))
def test_test_points_are_valid(point, arch):
    make_config("fastgemm", POINTS[point], "fp32", arch)


# ---- constraints --------------------------------------------------------------------------------

def test_bm_must_be_whole_a_vectors():
    found = violations_of({**SEED, "AV": 16})
    assert found == ["each thread group along M holds one A vector of AV rows: BM=24 must be a multiple of AV=16"]


def test_a_warp_shares_one_a_vector():
    # 48 rows in 2 groups of 24: 64 threads give 32 per group (valid), 32 threads give 16 (not)
    make_config("fastgemm", {**SEED, "BM": 48, "THREADS": 64, "BN": 128, "KC": 8})
    found = violations_of({**SEED, "BM": 48, "THREADS": 32, "BN": 128})
    assert any("THREADS/(BM/AV) = 32/(48/24) = 16 threads per A vector, must be a whole multiple of 32" in v
               for v in found), found
    found = violations_of({**SEED, "BM": 96, "AV": 32, "THREADS": 128})  # 3 groups do not split 128 threads
    assert any("128/(96/32) = 42.6667 threads per A vector" in v for v in found), found


def test_b_is_whole_float4_vectors_per_thread():
    found = violations_of({**SEED, "BN": 256})  # 128 threads x 4 floats = 512 columns at least
    assert found == ["each thread owns whole float4 column vectors of B: BN=256 must be a multiple of "
                     "4*THREADS/(BM/AV)=512"]


def test_kc_divides_bk():
    found = violations_of({**SEED, "KC": 16})
    assert found == ["products are added into the C tile every KC k steps, within one K tile: BK=8 must be a "
                     "multiple of KC=16"]


def test_register_sums_are_bounded():
    found = violations_of({**SEED, "BN": 1024, "KC": 8})  # 24 rows x 8 columns per thread
    assert found[0] == "register sums per thread AV*4*NB = 24*4*2 = 192 exceed 128"
    assert len(found) == 2 and found[1].startswith("estimated registers per thread = 332 (sums 192,")


def test_register_estimate_is_checked_against_the_thread_count():
    # 1024 threads leave 64 registers each: 4*4*1 sums + 2*4 A + 16*1*4 B window + 4 + 24 do not fit
    found = violations_of({"BM": 16, "BN": 1024, "BK": 16, "THREADS": 1024, "AV": 4, "KC": 4, "preload": 1})
    assert found == ["estimated registers per thread = 116 (sums 16, A vectors 8, B window BK*NB*4 = 64, "
                     "A staging 4, other 24) exceed the limit of 64 for 1024 threads; it would spill"]
    make_config("fastgemm", {"BM": 16, "BN": 1024, "BK": 4, "THREADS": 1024, "AV": 4, "KC": 4, "preload": 0})
    found = violations_of({**SEED, "BK": 32, "KC": 8})  # a 32-row B window: 96 + 48 + 128 + ...
    assert re.fullmatch(r"estimated registers per thread = \d+ \(sums 96, A vectors 48, B window BK\*NB\*4 = 128, "
                        r"A staging 8, other 24\) exceed the limit of 255 for 128 threads; it would spill", found[0])


def test_shared_memory_limit_per_architecture():
    # (On sm_90 a C tile too big for shared memory is also too big for the registers that sum it.)
    params = {"BM": 128, "BN": 512, "BK": 8, "THREADS": 512, "AV": 32, "KC": 8, "preload": 0}
    make_config("fastgemm", {**params, "BM": 64, "THREADS": 256})
    found = violations_of(params, "sm_90")  # 128 x 512 floats = 256 KiB of C, plus A's tile
    assert "shared memory = 270592 bytes exceeds sm_90's limit of 232448 bytes per block" in found
    found = violations_of({**SEED, "BM": 48, "THREADS": 256, "KC": 8}, "sm_89")  # 96 KiB of C + A
    assert found == ["shared memory = 101632 bytes exceeds sm_89's limit of 101376 bytes per block"]


def test_every_violation_is_listed():
    found = violations_of({"BM": 24, "BN": 128, "BK": 4, "THREADS": 1024, "AV": 16, "KC": 8, "preload": 1})
    assert len(found) == 3  # BM/AV, BN/(4*THREADS), KC > BK; no register checks on a broken layout
    assert any("BM=24 must be a multiple of AV=16" in v for v in found)
    assert any("BK=4 must be a multiple of KC=8" in v for v in found)
    assert any("BN=128 must be a multiple of 4*THREADS/(BM/AV)=4096" in v for v in found)


def test_space_has_enough_valid_points():
    space = load_space("fastgemm")
    fam = get_family("fastgemm")
    assert list(space.params) == [p.name for p in fam.params]
    valid = 0
    for values in itertools.product(*space.params.values()):
        try:
            make_config("fastgemm", dict(zip(space.params, values)), "fp32", "sm_90")
            valid += 1
        except InvalidPoint:
            pass
    assert valid >= 500


# ---- rendering ----------------------------------------------------------------------------------

@pytest.mark.parametrize("point", sorted(POINTS))
def test_renders(point):
    config = make_config("fastgemm", POINTS[point])
    source = render_kernel(config)
    for syntax in ("{{", "{%", "{#"):
        assert syntax not in source
    assert f"{config.name}(int M, int N, int K" in source
    assert "gg_store_c<4>(C, N, M, N" in source  # the shared epilogue: C not read when beta == 0
    assert "gg_load<4>(rb[s][j], B, N, K, N" in source  # guarded float4 loads of B
    assert f"constexpr int BM = {config.params['BM']}, BN = {config.params['BN']}, BK = {config.params['BK']};" \
        in source
    assert f"constexpr bool PRELOAD = {'true' if config.params['preload'] else 'false'};" in source
    assert f"constexpr int NB = {config.derived['NB']};" in source
    harness = render_kernel(config, harness=True)
    assert harness.count("int main(") == 1


# ---- nvcc ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builds():
    return build_all({(p, a): make_config("fastgemm", POINTS[p], "fp32", a) for p in POINTS for a in ARCHS})


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("point", sorted(POINTS))
def test_compiles_without_spills(builds, point, arch):
    config, result = builds[(point, arch)]
    usage = assert_compiles_without_spills(config, result)
    assert f"for '{arch}'" in result.log
    assert usage.registers <= config.derived["REGISTER_LIMIT"]


def ptx_of(config, tmp_path):
    return nvcc_compile(render_kernel(config), tmp_path / f"{config.name}.ptx", config.arch.name, "-ptx").read_text()


@pytest.mark.nvcc
@pytest.mark.parametrize("kc", slow_after(1, [8, 1, 2]))
def test_the_c_tile_is_written_in_shared_memory_every_kc_steps(tmp_path, kc):
    """The compiler must not keep the C tile in registers: per K tile, each thread adds its
    AV x NB = 24 float4 vectors into shared memory BK/KC times, in each of the two copies of
    the K loop (interior blocks, edge blocks), plus once to zero them first."""
    config = make_config("fastgemm", {**SEED, "KC": kc})
    stores = len(re.findall(r"st\.shared\.v4\.", ptx_of(config, tmp_path)))
    assert stores == 24 * (1 + 2 * (8 // kc))
