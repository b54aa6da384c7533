"""The tiny model's placements the ring, pinning and concurrency benches compare, one table: the monolithic
worker and 2, 4 and 12 even stages of its 12 layers."""

from __future__ import annotations

PLACEMENTS: dict[str, list[tuple[int, int]]] = {
    "monolithic": [(0, 12)],
    "2-stages": [(0, 6), (6, 12)],
    "4-stages": [(0, 3), (3, 6), (6, 9), (9, 12)],
    "12-stages": [(k, k + 1) for k in range(12)],
}
