"""The fill's plan (gemmgen.tune.fill) without a GPU: which token counts, in what order."""
import math

from gemmgen.describe.problem import Shape
from gemmgen.tune.fill import FillPoint, fill_counts, interleave

LISTED = [16, 128, 512, 2048, 8192]


def test_token_counts_alternate_between_midpoints_and_drawn_ones_in_the_order_taken():
    """Without a stored kernel there are no boundaries: the geometric midpoints of the listed
    counts and random counts take turns, so a fill stopped after a few has some of each."""
    counts = fill_counts(None, [], 4096, 4096, LISTED, 12, seed=3)
    middle = [round(math.sqrt(a * b)) for a, b in zip(LISTED, LISTED[1:])]
    assert middle == [45, 256, 1024, 4096]
    assert counts[0:8:2] == middle  # every other count, in turn
    assert len(counts) == len(set(counts)) == 12
    assert all(1 <= m <= 8192 and m not in LISTED for m in counts)
    assert counts != sorted(counts)  # the order taken, not ascending M


def test_a_cap_keeps_the_first_taken():
    assert fill_counts(None, [], 4096, 4096, LISTED, 3, seed=3) == fill_counts(None, [], 4096, 4096, LISTED, 12,
                                                                                  seed=3)[:3]


def test_layers_take_turns_so_a_stopped_fill_has_measured_each():
    def points(n, ms):
        return [FillPoint(Shape(m, n, 4096), ()) for m in ms]
    qkv, o, down = points(6144, [45, 3000, 256]), points(4096, [45]), points(14336, [256, 45])
    plan = interleave([qkv, o, down])
    assert [(p.shape.n, p.shape.m) for p in plan] == [(6144, 45), (4096, 45), (14336, 256), (6144, 3000),
                                                      (14336, 45), (6144, 256)]
    assert {p.shape.n for p in plan[:3]} == {6144, 4096, 14336}
    assert interleave([]) == [] and interleave([[], o]) == o
