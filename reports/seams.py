"""The report's seam section: each seam against its physical bound, and scaling with the stage count.

Reads the ``seam_model`` that certify.measure stores on every staged placement record (built by
pipeline.physics.model); placements without one (older certificates) are simply left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from markupsafe import Markup, escape

from pipeline import routes
from reports import charts

# The other charts' colours first, so a page keeps one palette.
PALETTE = (
    charts.STAGE_COLOUR,
    charts.SEAM_COLOUR,
    charts.BAR_COLOUR,
    charts.FAIL_COLOUR,
    "#72b7b2",
    "#b279a2",
)


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.3f}"


def _link(seam: Mapping[str, Any]) -> str:
    rate = seam.get("rate_mbit")
    rate_text = (
        "unshaped" if rate is None else (f"{rate / 1000:g} Gbit/s" if rate >= 1000 else f"{rate:g} Mbit/s")
    )
    if not seam.get("delay_ms") and rate is None:
        return "loopback (unshaped)"
    return f"{seam.get('delay_ms', 0):g} ms one way (RTT {seam.get('rtt_ms', 0):g} ms), {rate_text}"


def modelled(placements: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Placements the seam section speaks of: shaped seams or seams the driver does not relay (plain
    loopback relays are already in the speed table)."""
    return [
        p
        for p in placements
        if p.get("seam_model")
        and (p["seam_model"].get("shaped") or not routes.recorded(p["seam_model"].get("forwarding")).relays)
    ]


def seam_frame(placements: Sequence[Mapping[str, Any]]) -> pd.DataFrame | None:
    """One row per seam: bytes, link, bound, measured, ratio."""
    rows = []
    for p in modelled(placements):
        m = p["seam_model"]
        for s in m["seams"]:
            rows.append(
                {
                    "placement": p["name"],
                    "forwarding": _forwarding(p, m),
                    "seam (cut)": f"{s['seam']} (layer {s['cut']})",
                    "bytes / token": f"{s['bytes_per_token']:,}",
                    "link": _link(s),
                    "bound ms": _ms(s["bound_s"]),
                    "measured ms": _ms(s["measured_s"]),
                    "measured / bound": "—" if s["ratio"] is None else f"{s['ratio']:.2f}",
                }
            )
    return pd.DataFrame(rows) if rows else None


def _floor_row(floor: Mapping[str, Any], size: int) -> Mapping[str, Any] | None:
    return next((r for r in floor.get("sizes", []) if r["bytes"] == size), None)


def _times_floor(measured: float | None, floor_s: float) -> str:
    return "—" if measured is None or floor_s <= 0 else f"{measured / floor_s:.1f}×"


PROCESS_FLOORS = (("one_core", "1 core"), ("two_cores", "2 cores"))  # transport_floor's process rows


def _process_floors(row: Mapping[str, Any], crossings: int, measured: float | None) -> dict[str, str]:
    """The floors between two processes (one core, two cores) and the seam's ratio to each, one cell
    apiece with the two figures side by side; "—" for one a certificate lacks (older, or one CPU)."""
    floors = [
        row[f"tcp_{key}_round_trip_s"]["median"] * crossings / 2 if f"tcp_{key}_round_trip_s" in row else None
        for key, _ in PROCESS_FLOORS
    ]
    label = " / ".join(name for _, name in PROCESS_FLOORS)
    return {
        f"process floor ms ({label})": " / ".join(_ms(f) for f in floors),
        f"measured / process floor ({label})": " / ".join(
            "—" if f is None else _times_floor(measured, f) for f in floors
        ),
    }


def _tls_floors(row: Mapping[str, Any], crossings: int, measured: float | None) -> dict[str, str]:
    """The same bytes over mutual TLS (a run with `dgr certify --tls`), gRPC and TCP, one cell apiece
    with the seam's ratio; nothing for a run without TLS."""
    if "grpc_tls_round_trip_s" not in row:
        return {}
    grpc_s = row["grpc_tls_round_trip_s"]["median"] * crossings / 2
    tcp_s = row["tls_tcp_round_trip_s"]["median"] * crossings / 2
    return {
        "gRPC+TLS floor ms": _ms(grpc_s),
        "TCP+TLS floor ms": _ms(tcp_s),
        "measured / TCP+TLS floor": _times_floor(measured, tcp_s),
    }


def floor_frame(
    placements: Sequence[Mapping[str, Any]], floor: Mapping[str, Any] | None
) -> pd.DataFrame | None:
    """One row per seam of every staged placement: its measured cost next to the transport floor of the
    same bytes on this machine (pipeline.transport_floor).  A chained (or ring) seam is one crossing,
    read against half a round trip; a relayed seam is a round trip (the boundary in, the reply out),
    read against a whole one at the boundary's size (the last stage's reply carries logits: more
    bytes, so its floor is higher than shown).  Beside the in-process TCP floor, the floors between two
    processes held to one core and to two: a seam between workers is one of those, and which one
    depends on where the scheduler runs them."""
    if not floor:
        return None
    rows = []
    for p in placements:
        m = p.get("seam_model")
        if not m or p.get("role") != "under test":
            continue
        crossings = len(routes.recorded(m["forwarding"]).seam_hops(0))  # what the seam's time spans
        for s in m["seams"]:
            row = _floor_row(floor, s["bytes_per_token"])
            if row is None:
                continue
            grpc_s = row["grpc_round_trip_s"]["median"] * crossings / 2
            tcp_s = row["tcp_round_trip_s"]["median"] * crossings / 2
            rows.append(
                {
                    "placement": p["name"],
                    "forwarding": _forwarding(p, m),
                    "seam (cut)": f"{s['seam']} (layer {s['cut']})",
                    "bytes / token": f"{s['bytes_per_token']:,}",
                    "crossings": crossings,
                    "measured ms": _ms(s["measured_s"]),
                    "gRPC floor ms": _ms(grpc_s),
                    "measured / gRPC floor": _times_floor(s["measured_s"], grpc_s),
                    "TCP floor ms": _ms(tcp_s),
                    "measured / TCP floor": _times_floor(s["measured_s"], tcp_s),
                    **_process_floors(row, crossings, s["measured_s"]),
                    **_tls_floors(row, crossings, s["measured_s"]),
                    "shaped bound ms": _ms(s["bound_s"]) if m.get("shaped") else "—",
                }
            )
    return pd.DataFrame(rows) if rows else None


def _forwarding(placement: Mapping[str, Any], model: Mapping[str, Any]) -> str:
    """A ring's transport beside its name: a pass-port ring's seams read best against the TCP floor,
    and how its deliveries reached the driver (certificates made before the delivery port say nothing)."""
    transport = placement.get("ring_transport")
    deliveries = (placement.get("speed") or {}).get("ring_deliveries")
    if transport and deliveries:
        transport = f"{transport}, deliveries as {deliveries}"
    return f"{model['forwarding']} ({transport})" if transport else model["forwarding"]


def floor_note(floor: Mapping[str, Any] | None) -> str | None:
    """How the floor was taken, for the line above its table."""
    if not floor or not floor.get("sizes"):
        return None
    sizes = ", ".join(
        f"{r['bytes']:,} bytes: gRPC {r['grpc_round_trip_s']['median'] * 1e3:.3f} ms "
        f"(IQR {r['grpc_round_trip_s']['q1'] * 1e3:.3f}-{r['grpc_round_trip_s']['q3'] * 1e3:.3f}), "
        f"TCP {r['tcp_round_trip_s']['median'] * 1e3:.3f} ms"
        + "".join(
            f", TCP between processes on {name} {r[f'tcp_{key}_round_trip_s']['median'] * 1e3:.3f} ms"
            for key, name in PROCESS_FLOORS
            if f"tcp_{key}_round_trip_s" in r
        )
        for r in floor["sizes"]
    )
    return (
        f"median loopback round trips over {floor['round_trips']} calls each, no model, load average "
        f"{floor['load_average']:.2f}: {sizes}"
    )


def token_frame(placements: Sequence[Mapping[str, Any]]) -> pd.DataFrame | None:
    """One row per placement: the decode token's bound against what was measured."""
    rows = []
    for p in modelled(placements):
        m = p["seam_model"]
        rows.append(
            {
                "placement": p["name"],
                "stages": p["n_stages"],
                "forwarding": m["forwarding"],
                "crossings / token": m["crossings_per_token"],
                "compute ms": _ms(m["compute_s"]),
                "crossing bound ms": _ms(m["crossing_bound_s"]),
                "bound tok/s": "—" if not m.get("bound_tok_s") else f"{m['bound_tok_s']:.1f}",
                "measured tok/s": f"{m['measured_tok_s']:.1f}",
                "bound / measured time": "—" if m.get("efficiency") is None else f"{m['efficiency']:.2f}",
                "seam share": "—" if m.get("seam_share") is None else f"{m['seam_share'] * 100:.0f}%",
                "shaping": m.get("backend") or "—",
            }
        )
    return pd.DataFrame(rows) if rows else None


def shaping_notes(placements: Sequence[Mapping[str, Any]]) -> list[str]:
    """How the shaped links were made, once per kind (the fabric's own words)."""
    seen: dict[str, str] = {}
    for p in placements:
        fabric = p.get("fabric") or {}
        if fabric.get("backend") and fabric["backend"] not in seen:
            seen[fabric["backend"]] = str(fabric.get("description", fabric["backend"]))
    return list(seen.values())


_Point = tuple[int, float, float | None, float]
"""(stages, measured tok/s, bound tok/s, seam share): one placement of a group in the scaling chart."""


def _series(placements: Sequence[Mapping[str, Any]]) -> dict[str, list[_Point]]:
    """Group label -> [(stages, measured tok/s, bound tok/s, seam share)], sorted by stage count."""
    groups: dict[str, list[_Point]] = {}
    for p in modelled(placements):
        m = p["seam_model"]
        label = f"{_link(m['seams'][0]) if m['seams'] else 'loopback'}, {m['forwarding']}"
        groups.setdefault(label, []).append(
            (
                int(p["n_stages"]),
                float(m["measured_tok_s"]),
                m.get("bound_tok_s"),
                float(m.get("seam_share") or 0.0),
            )
        )
    return {k: sorted(v) for k, v in groups.items()}


@dataclass(frozen=True)
class _Frame:
    """The scaling chart's geometry and its two scales, fixed once from every group's points so each
    mark (axes, ticks, lines, dots) is placed by the same arithmetic."""

    stages: list[int]
    lo: float
    hi: float
    width: int = 760
    panel_w: int = 300
    panel_h: int = 220
    left: int = 56
    top: int = 34

    @property
    def ox2(self) -> int:
        """Where the seam-share panel starts."""
        return self.left + self.panel_w + 90

    def x_of(self, ox: float, n: int) -> float:
        n_lo, n_hi = min(self.stages), max(self.stages)
        return ox + (0.5 if n_hi == n_lo else (n - n_lo) / (n_hi - n_lo)) * (self.panel_w - 20) + 10

    def y_speed(self, v: float) -> float:
        return self.top + self.panel_h - (math.log10(v) - self.lo) / (self.hi - self.lo) * self.panel_h

    def y_share(self, s: float) -> float:
        return self.top + self.panel_h - s * self.panel_h


def _frame(groups: Mapping[str, list[_Point]]) -> _Frame:
    """Stage counts on x; the speed scale spans every measured and bound tok/s with a factor 1.5 of
    margin either side."""
    stages = sorted({n for pts in groups.values() for n, *_ in pts})
    speeds = [v for pts in groups.values() for _, m, b, _ in pts for v in (m, b) if v]
    return _Frame(stages=stages, lo=math.log10(min(speeds) / 1.5), hi=math.log10(max(speeds) * 1.5))


def _panels(f: _Frame) -> list[str]:
    """Both panels' boxes, titles and stage-count axes."""
    parts: list[str] = []
    top, panel_w, panel_h = f.top, f.panel_w, f.panel_h
    for ox, label in ((f.left, "decode tok/s (log)"), (f.ox2, "seam share of token time")):
        parts.append(
            f'<rect x="{ox}" y="{top}" width="{panel_w}" height="{panel_h}" fill="none" stroke="#999"/>'
        )
        parts.append(f'<text x="{ox}" y="{top - 6}" class="chart-note">{escape(label)}</text>')
        for n in f.stages:
            parts.append(
                f'<text x="{f.x_of(ox, n):.1f}" y="{top + panel_h + 16}" text-anchor="middle">{n}</text>'
            )
        parts.append(
            f'<text x="{ox + panel_w / 2:.1f}" y="{top + panel_h + 32}" text-anchor="middle" '
            f'class="chart-note">stages</text>'
        )
    return parts


def _y_ticks(f: _Frame) -> list[str]:
    """Decades on the speed panel (with grid lines), 0/50/100% on the share panel."""
    parts: list[str] = []
    left, ox2 = f.left, f.ox2
    for e in range(math.ceil(f.lo), math.floor(f.hi) + 1):
        y = f.y_speed(10**e)
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{10**e:g}</text>')
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + f.panel_w}" y2="{y:.1f}" stroke="#eee"/>')
    for frac in (0.0, 0.5, 1.0):
        y = f.y_share(frac)
        parts.append(f'<text x="{ox2 - 6}" y="{y + 4:.1f}" text-anchor="end">{frac * 100:.0f}%</text>')
    return parts


def _group_lines(f: _Frame, colour: str, pts: list[_Point]) -> list[str]:
    """One group's lines: measured speed (solid), its bound (dashed, where known), seam share."""
    parts: list[str] = []
    left, ox2 = f.left, f.ox2
    measured = " ".join(f"{f.x_of(left, n):.1f},{f.y_speed(m):.1f}" for n, m, _, _ in pts)
    parts.append(f'<polyline points="{measured}" fill="none" stroke="{colour}" stroke-width="2"/>')
    bounds = [(n, b) for n, _, b, _ in pts if b]
    if bounds:
        line = " ".join(f"{f.x_of(left, n):.1f},{f.y_speed(b):.1f}" for n, b in bounds)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5" '
            f'stroke-dasharray="5 3"/>'
        )
    share = " ".join(f"{f.x_of(ox2, n):.1f},{f.y_share(s):.1f}" for n, _, _, s in pts)
    parts.append(f'<polyline points="{share}" fill="none" stroke="{colour}" stroke-width="2"/>')
    return parts


def _group_dots(f: _Frame, colour: str, label: str, pts: list[_Point]) -> list[str]:
    """One group's points, each with a tooltip naming its figures; the bound gets a hollow mark."""
    parts: list[str] = []
    left, ox2 = f.left, f.ox2
    for n, m, b, s in pts:
        tip = (
            f"{label}: {n} stages, {m:.1f} tok/s"
            + (f" (bound {b:.1f})" if b else "")
            + f", seams {s * 100:.0f}%"
        )
        parts.append(
            f'<circle cx="{f.x_of(left, n):.1f}" cy="{f.y_speed(m):.1f}" r="3.5" fill="{colour}">'
            f"<title>{escape(tip)}</title></circle>"
        )
        if b:  # the bound as a hollow mark too: a group with one stage count has no dashed line
            parts.append(
                f'<circle cx="{f.x_of(left, n):.1f}" cy="{f.y_speed(b):.1f}" r="3.5" fill="none" '
                f'stroke="{colour}" stroke-width="1.5"><title>{escape(tip)}</title></circle>'
            )
        parts.append(
            f'<circle cx="{f.x_of(ox2, n):.1f}" cy="{f.y_share(s):.1f}" r="3.5" fill="{colour}">'
            f"<title>{escape(tip)}</title></circle>"
        )
    return parts


def _bound_note(f: _Frame) -> list[str]:
    """What the dashed lines and hollow marks are, under the share panel."""
    return [
        f'<text x="{f.ox2}" y="{f.top + f.panel_h + 50}" class="chart-note">'
        "dashed / hollow: the physical bound</text>",
        f'<text x="{f.ox2}" y="{f.top + f.panel_h + 66}" class="chart-note">'
        "(stage compute + crossing bounds)</text>",
    ]


def scaling_chart(placements: Sequence[Mapping[str, Any]], *, title: str) -> Markup:
    """Two panels against the stage count: decode tok/s (log scale; dashed: the physical bound) and
    the share of a token's time spent in seams."""
    groups = _series(placements)
    if not groups:
        return Markup("")
    f = _frame(groups)
    legend_h = 18 * len(groups) + 10
    height = f.top + f.panel_h + 40 + legend_h
    parts = [*_panels(f), *_y_ticks(f)]
    for i, (label, pts) in enumerate(groups.items()):
        colour = PALETTE[i % len(PALETTE)]
        parts += _group_lines(f, colour, pts)
        parts += _group_dots(f, colour, label, pts)
        parts.append(charts.swatch(f.left, f.top + f.panel_h + 50 + 18 * i, colour, label))
    parts += _bound_note(f)
    return charts.svg(f.width, height, title, parts)
