"""Do layer ranges tile a model's layers: 0..n_layer, in order, each non-empty, each where the last ended?

One answer for the three places that ask it (a recipe's placements, a placement file's stages, a
proposed split in `dgr admit`), each of which words its own refusal from where the tiling breaks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Break:
    """The first place the ranges stop tiling the layers."""

    stage: int | None  # the range that breaks it; None: the ranges end before or after n_layer
    expected: int  # where that range should have started (stage None: n_layer, where they should end)
    begin: int  # the range's first layer (stage None: where the ranges ended, as end)
    end: int

    @property
    def empty(self) -> bool:
        """The range starts where it should but holds no layer."""
        return self.stage is not None and self.begin == self.expected and self.end <= self.begin


def first_break(stages: Sequence[Sequence[int]], n_layer: int | None = None) -> Break | None:
    """None when ``stages`` ([begin, end) each) cover 0..n_layer in order, each non-empty and starting
    where the one before ended; ``n_layer`` None: only that they start at 0 and follow each other."""
    expected = 0
    for k, (begin, end) in enumerate(stages):
        if begin != expected or end <= begin:
            return Break(stage=k, expected=expected, begin=int(begin), end=int(end))
        expected = int(end)
    if n_layer is not None and expected != n_layer:
        return Break(stage=None, expected=n_layer, begin=expected, end=expected)
    return None
