"""Search spaces: every family has one, it only holds allowed values, bad files are reported
with the file and the problem, and sampling is reproducible."""

import random

import pytest

import gemmgen.tune.space
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.errors import GemmgenError, InvalidPoint
from gemmgen.tune.space import all_spaces, load_space


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_has_a_space_of_allowed_values(family):
    fam = FAMILIES[family]
    space = load_space(family)
    assert space.family == family
    assert list(space.params) == [p.name for p in fam.params]
    for p in fam.params:
        values = space.params[p.name]
        assert values, p.name
        assert set(values) <= set(p.choices), p.name
        assert all(type(v) is type(p.choices[0]) for v in values), p.name
    assert space.precisions and set(space.precisions) <= set(fam.precisions)


def test_all_spaces():
    spaces = all_spaces()
    assert set(spaces) == set(FAMILIES)
    # naive.toml: BX has 5 values, BY 6; shared.toml: TILE 3, PAD 3
    assert spaces["naive"].size == 5 * 6
    assert spaces["shared"].size == 3 * 3


@pytest.mark.parametrize("point", ["v1", "v2", "v3", "v4", "v5", "v6"])
def test_the_fastcuda_points_lie_in_their_family_space(point):
    named = NAMED_POINTS[point]
    space = load_space(named.family)
    assert named.precision in space.precisions
    for name, value in named.params.items():
        assert value in space.params[name], f"{point}: {name}={value} not in {space.params[name]}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sampling_is_reproducible_and_stays_in_the_space(family):
    space = load_space(family)
    first = [space.sample(random.Random(7)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    rng_a, rng_b = random.Random(2024), random.Random(2024)
    draws_a = [space.sample(rng_a) for _ in range(50)]
    draws_b = [space.sample(rng_b) for _ in range(50)]
    assert draws_a == draws_b
    assert len({tuple(d.items()) for d in draws_a}) > 1  # it does move through the space
    for draw in draws_a:
        assert list(draw) == list(space.params)
        assert all(draw[name] in values for name, values in space.params.items())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_space_holds_valid_points(family):
    space = load_space(family)
    rng = random.Random(99)
    valid = 0
    for _ in range(400):
        try:
            make_config(family, space.sample(rng), space.precisions[0], "sm_90")
            valid += 1
        except InvalidPoint:
            pass
    assert valid > 0


def test_a_space_narrows_to_the_values_a_precision_and_variant_allow():
    """hopper's promote: 0 for 16-bit types, 1 for FP8 block scales, every one for other FP8 scalings;
    a block-scaled tune then finds points (the space's promote=0 alone could build none)."""
    from gemmgen.describe.problem import Variant
    from gemmgen.tune.loop import check_variant

    space = load_space("hopper")
    assert space.params["promote"] == (0, 1, 4, 16)
    assert space.narrowed("bf16", Variant()).params["promote"] == (0,)
    block = Variant("nt", "bf16", scale="block")
    assert space.narrowed("e4m3", block).params["promote"] == (1,)
    assert space.narrowed("e4m3", Variant("nt", "bf16", scale="row")).params["promote"] == (0, 1, 4, 16)
    assert space.narrowed("e4m3", block).params["BM"] == space.params["BM"]  # the others as they are
    check_variant(space, "e4m3", parse_arch("sm_90"), block)  # raises where no point computes it
    from gemmgen.tune.loop import named_points_in
    assert named_points_in(space.narrowed("e4m3", block), "e4m3") == ["hopper_e4m3_block"]  # a block tune's seed


# ---- bad files ----------------------------------------------------------------------------------

@pytest.fixture
def spaces_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(gemmgen.tune.space, "search_spaces_dir", lambda: tmp_path)
    return tmp_path


def _load_error(spaces_dir, text: str) -> str:
    path = spaces_dir / "shared.toml"
    path.write_text(text)
    with pytest.raises(GemmgenError) as err:
        load_space("shared")
    message = str(err.value)
    assert str(path) in message
    return message


def test_a_good_file_in_the_patched_folder_loads(spaces_dir):
    (spaces_dir / "shared.toml").write_text('precisions = ["fp32"]\n[params]\nTILE = [8, 16]\nPAD = [0]\n')
    space = load_space("shared")
    assert space.params == {"TILE": (8, 16), "PAD": (0,)}
    assert space.size == 2


def test_a_missing_file(spaces_dir):
    with pytest.raises(GemmgenError) as err:
        load_space("warp")
    assert str(spaces_dir / "warp.toml") in str(err.value)
    assert "missing" in str(err.value)


def test_invalid_toml(spaces_dir):
    assert "not valid TOML" in _load_error(spaces_dir, "[params\nTILE = [8]\n")


def test_no_params_table(spaces_dir):
    assert "[params]" in _load_error(spaces_dir, 'precisions = ["fp32"]\n')
    assert "[params]" in _load_error(spaces_dir, 'params = 3\n')


def test_an_unknown_parameter(spaces_dir):
    message = _load_error(spaces_dir, "[params]\nTILE = [8]\nPAD = [0]\nBK = [8]\n")
    assert "'BK'" in message
    assert "TILE, PAD" in message


def test_a_value_the_family_does_not_allow(spaces_dir):
    message = _load_error(spaces_dir, "[params]\nTILE = [8, 64]\nPAD = [0]\n")
    assert "TILE=64" in message
    assert "4, 8, 16, 32" in message


@pytest.mark.parametrize("values", ["8", "[]"])
def test_values_must_be_a_non_empty_list(spaces_dir, values):
    message = _load_error(spaces_dir, f"[params]\nTILE = {values}\nPAD = [0]\n")
    assert "TILE must be a non-empty list" in message


def test_a_parameter_left_out(spaces_dir):
    message = _load_error(spaces_dir, "[params]\nTILE = [8]\n")
    assert "missing" in message
    assert "PAD" in message


def test_a_precision_the_family_does_not_take(spaces_dir):
    message = _load_error(spaces_dir, 'precisions = ["fp32", "fp16"]\n[params]\nTILE = [8]\nPAD = [0]\n')
    assert "fp16" in message
    assert "'shared'" in message


@pytest.mark.parametrize("line,words", [
    ('precisions = "fp32"', "non-empty list"),
    ("precisions = []", "non-empty list"),
    ('family = "warp"', "family = 'warp'"),
])
def test_malformed_header_fields(spaces_dir, line, words):
    text = f'{line}\n[params]\nTILE = [8, 16]\nPAD = [0, 1]\n'
    assert words in _load_error(spaces_dir, text)


def test_values_must_have_the_parameter_type(spaces_dir):
    assert "are not int values" in _load_error(spaces_dir, '[params]\nTILE = ["8"]\nPAD = [0]\n')


def test_repeated_values_are_kept_once(spaces_dir):
    (spaces_dir / "shared.toml").write_text("[params]\nTILE = [8, 16, 8]\nPAD = [0, 0]\n")
    space = load_space("shared")
    assert space.params == {"TILE": (8, 16), "PAD": (0,)}
