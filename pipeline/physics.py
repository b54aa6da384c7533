"""The physical model of a staged placement: what its seams must cost at least, next to what they cost.

Link model (pipeline.seam_model, the one pipeline.seams builds): every node — the driver and each
stage — sits behind an access link, and a one-way message *into* node X is shaped by X's link: it
takes at least ``(delay_X - jitter_X) + bytes * 8 / rate_X``.  Stage k+1's link is seam k's profile
(``Placement.seam(k)``); stage 0's and the driver's links take seam 0's profile.  Only payload bytes
are counted (boundary tensor, token ids, logits);
protobuf, HTTP/2, TCP and IP headers come on top, so a measured seam can only be slower than its bound,
and a seam measured *faster* than its bound was not shaped as the recipe says.

Critical path of one decode token (one position, last logits row only), N stages:
  * relayed: the driver sends to stage k and takes its reply, for every k: 2N one-way crossings.
  * chained: driver -> stage 0 -> ... -> stage N-1 -> driver: N + 1 crossings (the acks travel back
    off the critical path).
The token's bound is the sum of the stages' own compute (measured by the workers) and of the bounds
of those crossings; decode tok/s can at best be its inverse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from manifests.recipe_model import Placement
from pipeline.routes import Hop, RouteSpec
from pipeline.seam_model import Link, Profiles, crossing_bound_s, profiles

TOKEN_BYTES = 4  # one int32 token id per position
LOGIT_BYTES = 4  # F32 logits


def links(p: Placement) -> Profiles:
    """The link into every node (pipeline.seam_model.profiles); a monolithic placement has no seam."""
    return profiles(p) if p.n_stages >= 2 else Profiles(driver=Link(), stages=(Link(),))


def shaped(link: Link) -> bool:
    return link.delay_s > 0 or link.rate_bps is not None


@dataclass(frozen=True, kw_only=True)
class Crossing:
    what: str
    into: str
    payload_bytes: int
    bound_s: float


def crossings(
    p: Placement,
    route: RouteSpec,
    *,
    boundary_bytes: Sequence[int],
    n_vocab: int,
    sideband_stages: Sequence[int] = (),
    tokens_forwarded: bool = True,
) -> list[Crossing]:
    """The one-way messages on one decode token's critical path (the route's ``critical_path``), each
    with its payload and its bound on the link it crosses.

    ``boundary_bytes[k]``: payload of seam k's boundary for one token; ``sideband_stages``: stages
    that take the token ids next to the boundary when the driver relays it; ``tokens_forwarded``: the
    token ids travel with every forwarded boundary.
    """
    n = p.n_stages
    if len(boundary_bytes) != n - 1:
        raise ValueError(f"{n} stages need {n - 1} seam byte counts, got {len(boundary_bytes)}")
    into = links(p)
    out: list[Crossing] = []
    for hop in route.critical_path(n):
        link = into.driver if hop.into is None else into.stages[hop.into]
        payload = _payload(hop, boundary_bytes, n_vocab, sideband_stages, tokens_forwarded)
        target = "driver" if hop.into is None else f"stage {hop.into}"
        out.append(
            Crossing(
                what=hop.what, into=target, payload_bytes=payload, bound_s=crossing_bound_s(payload, link)
            )
        )
    return out


def _payload(
    hop: Hop,
    boundary_bytes: Sequence[int],
    n_vocab: int,
    sideband_stages: Sequence[int],
    tokens_forwarded: bool,
) -> int:
    if hop.logits:
        return n_vocab * LOGIT_BYTES
    if hop.seam is None:
        return TOKEN_BYTES  # the token id into stage 0
    tokens = hop.tokens_with_boundary and tokens_forwarded
    sideband = not hop.tokens_with_boundary and hop.into is not None and hop.into in sideband_stages
    return boundary_bytes[hop.seam] + (TOKEN_BYTES if tokens or sideband else 0)


def seam_bound(route: RouteSpec, k: int, parts: Sequence[Crossing]) -> float:
    """The bound of what the driver measures as seam k (the route's ``seam_hops``)."""
    return sum(parts[i].bound_s for i in route.seam_hops(k))


def _seam_rows(
    p: Placement,
    route: RouteSpec,
    parts: Sequence[Crossing],
    bytes_per_seam: Sequence[int],
    measured_seams: Sequence[float],
) -> list[dict[str, Any]]:
    """Per seam: its link, the bound of what the driver measures as that seam, the measurement, the ratio."""
    into = links(p)
    rows: list[dict[str, Any]] = []
    for k in range(p.n_stages - 1):
        link = into.stages[k + 1]
        bound = seam_bound(route, k, parts)
        measured = measured_seams[k] if k < len(measured_seams) else None
        rows.append(
            {
                "seam": k,
                "cut": p.stages[k + 1][0],
                "bytes_per_token": bytes_per_seam[k],
                "delay_ms": link.delay_s * 1e3,
                "jitter_ms": link.jitter_s * 1e3,
                "rtt_ms": 2 * link.delay_s * 1e3,
                "rate_mbit": link.rate_bps / 1e6 if link.rate_bps else None,
                "bound_s": bound,
                "measured_s": measured,
                "ratio": measured / bound if measured is not None and bound > 0 else None,
            }
        )
    return rows


def model(
    p: Placement,
    route: RouteSpec,
    speed: Mapping[str, Any],
    *,
    n_vocab: int,
    sideband_stages: Sequence[int] = (),
    backend: str = "",
) -> dict[str, Any]:
    """Bound vs measured for one placement's decode, from its speed figures (certify.measure)."""
    bytes_per_seam = [int(b) for b in speed.get("seam_bytes_per_token", [])]
    parts = crossings(
        p, route, boundary_bytes=bytes_per_seam, n_vocab=n_vocab, sideband_stages=sideband_stages
    )
    into = links(p)
    seams = _seam_rows(p, route, parts, bytes_per_seam, [float(s) for s in speed.get("seam_s", [])])
    compute = float(sum(speed.get("stage_compute_s", [])))
    crossing_bound = float(sum(c.bound_s for c in parts))
    token_bound = compute + crossing_bound
    measured_tok_s = float(speed["decode_tok_s"]["median"])
    token_s = 1.0 / measured_tok_s if measured_tok_s > 0 else float("inf")
    ratios = [s["ratio"] for s in seams if s["ratio"] is not None]
    return {
        "forwarding": route.name,
        "backend": backend,
        "shaped": any(shaped(link) for link in into.stages),
        "crossings_per_token": len(parts),
        "crossings": [c.__dict__ for c in parts],
        "seams": seams,
        "seam_ratio_max": max(ratios) if ratios else None,
        "seam_ratio_min": min(ratios) if ratios else None,
        "compute_s": compute,
        "crossing_bound_s": crossing_bound,
        "token_bound_s": token_bound,
        "bound_tok_s": 1.0 / token_bound if token_bound > 0 else None,
        "measured_tok_s": measured_tok_s,
        "efficiency": (token_bound / token_s) if token_s > 0 and token_bound > 0 else None,
        "seam_share": max(0.0, (token_s - compute) / token_s) if token_s > 0 else None,
    }
