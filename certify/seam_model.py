"""The physical model of a seam: per-node link profiles from a recipe's seams, and the least time a
message, a seam or a whole decode token can take over them.  Pure functions (no I/O), so the report and
the gates can use them wherever the run happened.

Link model.  Every node of a placement (the driver and stage 0..N-1) has one access link.  A one-way
message INTO node X is shaped by X's link profile (delay, jitter, rate); what leaves X is not shaped on
X's side.  Stage k+1's link is seam k's profile (``Placement.seam(k)``); stage 0 and the driver have no
seam of their own and take seam 0's profile, so a relayed boundary (stage k -> driver -> stage k+1)
pays the driver's link and then stage k+1's, and a chained one (stage k -> stage k+1) pays stage k+1's
only.  A message A -> B costs at least ``min_delay_B + payload_bytes * 8 / rate_B``
(``crossing_bound_s``): the physical lower bound of one crossing, counting payload bytes only (headers
make the measured time larger, never smaller).  ``min_delay`` is delay - jitter: jitter is symmetric
around the delay (netem's default, and certify.shaper's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from certify.shaper import Link

if TYPE_CHECKING:
    from certify.recipes import Placement, Seam


def link_of(seam: Seam | None) -> Link:
    """A recipe seam as a link profile (absent fields: no delay, no jitter, unlimited rate)."""
    if seam is None:
        return Link()
    return Link(delay_s=(seam.delay_ms or 0.0) / 1e3, jitter_s=(seam.jitter_ms or 0.0) / 1e3,
                rate_bps=None if seam.rate_mbit is None else seam.rate_mbit * 1e6)


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


def relayed_round_trip_bound_s(request_bytes: int, reply_bytes: int, stage: Link, driver: Link) -> float:
    """A driver-relayed call: the request into the stage, then the reply into the driver."""
    return crossing_bound_s(request_bytes, stage) + crossing_bound_s(reply_bytes, driver)


@dataclass(frozen=True, kw_only=True)
class SeamBound:
    """Seam k's physical model for one token."""

    seam: int
    bytes_per_token: int  # boundary payload bytes (what the caller measured or the recipe states)
    delay_ms: float
    jitter_ms: float
    rtt_ms: float  # 2 x delay: the seam's link both ways
    rate_mbit: float | None
    forwarding: str
    bound_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"seam": self.seam, "bytes_per_token": self.bytes_per_token, "delay_ms": self.delay_ms,
                "jitter_ms": self.jitter_ms, "rtt_ms": self.rtt_ms, "rate_mbit": self.rate_mbit,
                "forwarding": self.forwarding, "bound_s": self.bound_s}


def seam_bounds(placement: Placement, bytes_per_token: Sequence[int], *, forwarding: str = "relayed",
                reply_bytes: Sequence[int] | None = None) -> list[SeamBound]:
    """Per seam, the least time one token's boundary can take to cross it.

    chained: stage k -> stage k+1, one crossing into stage k+1.  relayed: what the driver times as
    seam k (certify.drive: stage k+1's call wall minus its compute), i.e. the boundary into stage k+1
    plus stage k+1's reply into the driver; ``reply_bytes[k]`` is that reply's payload (default: the
    same as the boundary, true for every seam but the last, whose reply is logits).
    """
    if len(bytes_per_token) != placement.n_stages - 1:
        raise ValueError(
            f"{placement.name}: {placement.n_stages - 1} seams but {len(bytes_per_token)} byte counts")
    if forwarding not in ("relayed", "chained"):
        raise ValueError(f"forwarding is relayed or chained, not {forwarding!r}")
    prof = profiles(placement)
    out = []
    for k, nbytes in enumerate(bytes_per_token):
        into = prof.stages[k + 1]
        if forwarding == "chained":
            bound = crossing_bound_s(nbytes, into)
        else:
            back = nbytes if reply_bytes is None else reply_bytes[k]
            bound = relayed_round_trip_bound_s(nbytes, back, into, prof.driver)
        out.append(SeamBound(
            seam=k, bytes_per_token=int(nbytes), delay_ms=into.delay_s * 1e3, jitter_ms=into.jitter_s * 1e3,
            rtt_ms=2 * into.delay_s * 1e3, rate_mbit=None if into.rate_bps is None else into.rate_bps / 1e6,
            forwarding=forwarding, bound_s=bound,
        ))
    return out


def seam_rows(placement: Placement, measured_s: Sequence[float], bytes_per_token: Sequence[int], *,
              forwarding: str, logits_bytes: int) -> list[dict[str, Any]]:
    """The report's per-seam rows: the physical model (bytes, RTT, rate, bound), the measured seam time
    (certify.drive's ``seam_seconds``, median per token) and their ratio.  Relayed seam k is timed as
    stage k+1's call, whose reply is the next boundary or, on the last stage, one logits row."""
    replies = [*bytes_per_token[1:], logits_bytes] if forwarding == "relayed" else None
    bounds = seam_bounds(placement, bytes_per_token, forwarding=forwarding, reply_bytes=replies)
    return [{**b.as_dict(), "measured_s": float(m), "ratio": ratio(float(m), b.bound_s)}
            for b, m in zip(bounds, measured_s, strict=True)]


def ratio(measured_s: float, bound_s: float) -> float | None:
    """measured / bound (>= 1 on an honest run); None when the bound is 0 (an unshaped seam)."""
    return None if bound_s <= 0 else measured_s / bound_s


def token_bound_s(stage_compute_s: Sequence[float], bounds: Sequence[SeamBound]) -> float:
    """The issue's per-token bound: every stage's compute plus every seam's bound."""
    return float(sum(stage_compute_s)) + sum(b.bound_s for b in bounds)


def decode_token_bound_s(
    placement: Placement, seam_bytes: Sequence[int], stage_compute_s: Sequence[float], *,
    forwarding: str, logits_bytes: int, token_bytes: int = 4,
) -> float:
    """Least wall time of one decode token through the whole placement, the driver's crossings included.

    Over ``token_bound_s`` it adds what no seam carries: the token id into stage 0, and (relayed) stage
    0's boundary into the driver, or (chained) the last stage's logits into the driver's sink; for a
    relayed last stage the logits reply is in the last seam's bound already.
    """
    prof = profiles(placement)
    n = placement.n_stages
    first = crossing_bound_s(token_bytes, prof.stages[0])
    if n == 1:
        return float(stage_compute_s[0]) + first + crossing_bound_s(logits_bytes, prof.driver)
    if forwarding == "chained":
        bounds = seam_bounds(placement, seam_bytes, forwarding="chained")
        return token_bound_s(stage_compute_s, bounds) + first + crossing_bound_s(logits_bytes, prof.driver)
    replies = [*seam_bytes[1:], logits_bytes]
    bounds = seam_bounds(placement, seam_bytes, forwarding="relayed", reply_bytes=replies)
    return token_bound_s(stage_compute_s, bounds) + first + crossing_bound_s(seam_bytes[0], prof.driver)
