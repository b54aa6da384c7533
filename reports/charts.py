"""Inline SVG charts for the report: plain markup, no script, every label escaped."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

STAGE_COLOUR = "#4c78a8"
SEAM_COLOUR = "#f58518"
BAR_COLOUR = "#54a24b"
FAIL_COLOUR = "#e45756"


def _num(x: float) -> str:
    return f"{x:.1f}"


def _label(x: float, unit: str) -> str:
    if x >= 100:
        return f"{x:.0f} {unit}"
    if x >= 1:
        return f"{x:.2f} {unit}"
    return f"{x:.3g} {unit}"


def svg(width: int, height: int, title: str, parts: Sequence[str]) -> Markup:
    """One chart: the <svg> element and its title line around ``parts`` (markup, labels escaped)."""
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}" class="chart">'
        f'<text x="0" y="18" class="chart-title">{escape(title)}</text>' + "".join(parts) + "</svg>"
    )


def row_label(left: float, y: float, bar_h: float, name: str) -> str:
    """A bar's name, right-aligned just left of the bar."""
    return f'<text x="{left - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(name)}</text>'


def swatch(x: float, y: float, colour: str, label: str) -> str:
    """A legend entry: a colour square and its label on the baseline ``y``."""
    return (
        f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"/>'
        f'<text x="{x + 16}" y="{y}">{escape(label)}</text>'
    )


def decode_speed(rows: Sequence[tuple[str, float, float | None, bool]], *, title: str) -> Markup:
    """Horizontal bars: (placement, decode tok/s, threshold or None, passed)."""
    if not rows:
        return Markup("")
    width, left, bar_h, gap = 760, 190, 22, 8
    top = 30
    height = top + len(rows) * (bar_h + gap) + 30
    peak = max([v for _, v, _, _ in rows] + [t or 0 for _, _, t, _ in rows] + [1e-9])
    scale = (width - left - 90) / peak
    parts: list[str] = []
    for i, (name, value, limit, ok) in enumerate(rows):
        y = top + i * (bar_h + gap)
        w = max(1.0, value * scale)
        colour = BAR_COLOUR if ok else FAIL_COLOUR
        parts.append(row_label(left, y, bar_h, name))
        parts.append(f'<rect x="{left}" y="{y}" width="{_num(w)}" height="{bar_h}" fill="{colour}"/>')
        parts.append(
            f'<text x="{left + w + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{escape(_label(value, "tok/s"))}</text>'
        )
        if limit is not None:
            x = left + limit * scale
            parts.append(
                f'<line x1="{_num(x)}" y1="{y - 3}" x2="{_num(x)}" y2="{y + bar_h + 3}" '
                f'stroke="#222" stroke-width="2" stroke-dasharray="4 2"/>'
            )
    parts.append(
        f'<text x="{left}" y="{height - 8}" class="chart-note">dashed line: the recipe\'s minimum '
        f"for this hardware class</text>"
    )
    return svg(width, height, title, parts)


def stage_seam_time(rows: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, title: str) -> Markup:
    """Stacked bars per placement of the time one decode token spends in each stage and each seam.

    rows: (placement, per-stage compute seconds, per-seam seconds), interleaved stage 0, seam 0, stage 1...
    """
    if not rows:
        return Markup("")
    width, left, bar_h, gap, top = 760, 190, 22, 8, 30
    height = top + len(rows) * (bar_h + gap) + 44
    totals = [sum(s) + sum(m) for _, s, m in rows]
    peak = max(totals + [1e-12])
    scale = (width - left - 90) / peak
    parts: list[str] = []
    for i, (name, stages, seams) in enumerate(rows):
        y = top + i * (bar_h + gap)
        x = float(left)
        parts.append(row_label(left, y, bar_h, name))
        for k, stage_s in enumerate(stages):
            w = stage_s * scale
            parts.append(
                f'<rect x="{_num(x)}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{STAGE_COLOUR}" '
                f'stroke="#fff" stroke-width="0.5"><title>stage {k}: {stage_s * 1e3:.3f} ms</title></rect>'
            )
            x += w
            if k < len(seams):
                w = seams[k] * scale
                parts.append(
                    f'<rect x="{_num(x)}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{SEAM_COLOUR}" '
                    f'stroke="#fff" stroke-width="0.5">'
                    f"<title>seam {k}: {seams[k] * 1e3:.3f} ms</title></rect>"
                )
                x += w
        parts.append(
            f'<text x="{x + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{escape(_label(totals[i] * 1e3, "ms"))}</text>'
        )
    ly = height - 14
    parts.append(swatch(left, ly, STAGE_COLOUR, "stage compute"))
    parts.append(swatch(left + 130, ly, SEAM_COLOUR, "seam (transfer + RPC overhead)"))
    return svg(width, height, title, parts)


PALETTE = (STAGE_COLOUR, SEAM_COLOUR, BAR_COLOUR, "#b279a2", "#72b7b2", "#9d755d", FAIL_COLOUR, "#bab0ac")


def lines(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], *, title: str, unit: str) -> Markup:
    """One line per (name, points): y against x, both axes from 0, the x ticks at the points' own x (the
    prompt lengths a scenario ran), each point labelled with its value; a legend under the plot."""
    series = [(name, sorted(points)) for name, points in series if points]
    if not series:
        return Markup("")
    width, left, top, plot_h = 760, 90, 34, 170
    xs = sorted({x for _, points in series for x, _ in points})
    x_peak, y_peak = max(xs + [1e-9]), max([y for _, p in series for _, y in p] + [1e-9])
    plot_w = width - left - 60

    def at(x: float, y: float) -> tuple[float, float]:
        return left + x / x_peak * plot_w, top + plot_h - y / y_peak * plot_h

    base = top + plot_h
    parts = [f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" stroke="#222"/>']
    parts += [
        f'<text x="{_num(at(x, 0)[0])}" y="{base + 16}" text-anchor="middle">{x:,.0f}</text>' for x in xs
    ]
    for i, (name, points) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{_num(px)},{_num(py)}" for px, py in (at(x, y) for x, y in points))
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in points:
            px, py = at(x, y)
            parts.append(f'<circle cx="{_num(px)}" cy="{_num(py)}" r="3" fill="{colour}"/>')
            parts.append(f'<text x="{_num(px + 5)}" y="{_num(py - 5)}">{escape(_label(y, unit))}</text>')
        parts.append(swatch(left + (i % 3) * 220, base + 40 + (i // 3) * 18, colour, name))
    height = base + 48 + ((len(series) - 1) // 3) * 18
    return svg(width, height, title, parts)
