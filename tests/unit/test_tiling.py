"""manifests/tiling.py: where layer ranges stop tiling a model's layers, the one answer the recipe check,
the placement file and `dgr admit` word their refusals from."""

from __future__ import annotations

from manifests.tiling import Break, first_break


def test_ranges_that_tile_have_no_break() -> None:
    assert first_break([(0, 6), (6, 12)], 12) is None
    assert first_break([[0, 12]], 12) is None
    assert first_break([(0, 3), (3, 5)]) is None  # no n_layer: only that they follow each other from 0


def test_the_first_range_that_breaks_the_tiling_is_named() -> None:
    assert first_break([(1, 6), (6, 12)], 12) == Break(stage=0, expected=0, begin=1, end=6)
    assert first_break([(0, 6), (5, 12)], 12) == Break(stage=1, expected=6, begin=5, end=12)
    gap = first_break([(0, 6), (6, 6), (6, 12)], 12)
    assert gap == Break(stage=1, expected=6, begin=6, end=6) and gap.empty
    assert not Break(stage=1, expected=6, begin=5, end=5).empty  # a wrong start is said as such first


def test_ranges_that_end_short_or_past_the_model_break_at_the_end() -> None:
    assert first_break([(0, 6), (6, 10)], 12) == Break(stage=None, expected=12, begin=10, end=10)
    assert first_break([(0, 6), (6, 14)], 12) == Break(stage=None, expected=12, begin=14, end=14)
    assert first_break([], 12) == Break(stage=None, expected=12, begin=0, end=0)
    assert not first_break([], 12).empty
