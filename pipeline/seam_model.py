"""Per-node link profiles from a recipe's seams, and the least time one message can take over a link.
Pure functions (no I/O).  What a whole seam or decode token costs on its critical path (relayed or
chained) is pipeline.physics, built on these.

Link model.  Every node of a placement (the driver and stage 0..N-1) has one access link.  A one-way
message INTO node X is shaped by X's link profile (delay, jitter, rate); what leaves X is not shaped on
X's side.  Stage k+1's link is seam k's profile (``Placement.seam(k)``); stage 0 and the driver have no
seam of their own and take seam 0's profile, so a relayed boundary (stage k -> driver -> stage k+1)
pays the driver's link and then stage k+1's, and a chained one (stage k -> stage k+1) pays stage k+1's
only.  A message A -> B costs at least ``min_delay_B + payload_bytes * 8 / rate_B``
(``crossing_bound_s``): the physical lower bound of one crossing, counting payload bytes only (headers
make the measured time larger, never smaller).  ``min_delay`` is delay - jitter: jitter is symmetric
around the delay (netem's default, and pipeline.shaper's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.shaper import Link

if TYPE_CHECKING:
    from manifests.recipe_model import Placement, Seam


def link_of(seam: Seam | None) -> Link:
    """A recipe seam as a link profile (absent fields: no delay, no jitter, unlimited rate)."""
    if seam is None:
        return Link()
    return Link.of(delay_ms=seam.delay_ms, jitter_ms=seam.jitter_ms, rate_mbit=seam.rate_mbit)


@dataclass(frozen=True, kw_only=True)
class Profiles:
    """The access link of every node: the driver's, then one per stage."""

    driver: Link
    stages: tuple[Link, ...]


def profiles(placement: Placement) -> Profiles:
    """Stage k+1's link is seam k's; stage 0's and the driver's are seam 0's (no seam of their own)."""
    first = link_of(placement.seam(0))
    stages = [first] + [link_of(placement.seam(k)) for k in range(placement.n_stages - 1)]
    return Profiles(driver=first, stages=tuple(stages))


def crossing_bound_s(payload_bytes: int, into: Link) -> float:
    """Lower bound of one message's one-way crossing into a node: min delay + serialisation at its rate."""
    return into.min_delay_s + into.serialisation_s(payload_bytes)
