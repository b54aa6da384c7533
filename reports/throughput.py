"""The report's throughput table: aggregate decode tok/s with several sessions in flight.

Reads ``speed.concurrency`` (certify.throughput) from each placement record; the ratio column holds
each figure to the monolithic worker's one-session figure measured the same way (every chosen token
over the time from the sessions' common start to the last one's end), so the ratio is like for like.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd


def _single_stream(placements: Sequence[Mapping[str, Any]]) -> float | None:
    for p in placements:
        if p.get("n_stages") == 1 and p.get("role") == "reference":
            for level in (p.get("speed") or {}).get("concurrency", {}).get("levels", []):
                if level["sessions"] == 1 and "aggregate_tok_s" in level:
                    return float(level["aggregate_tok_s"]["median"])
    return None


def _cell(level: Mapping[str, Any], single: float | None) -> str:
    if "skipped" in level:
        return "skipped"
    f = level["aggregate_tok_s"]
    ratio = f" = {f['median'] / single:.2f}×" if single else ""
    odd = f", {level['diverging_sessions']} unlike alone" if level.get("diverging_sessions") else ""
    return f"{f['median']:.1f} (IQR {f['iqr']:.1f}){ratio}{odd}"


def concurrency_frame(placements: Sequence[Mapping[str, Any]]) -> pd.DataFrame | None:
    """One row per placement measured with several sessions, one column per concurrency level."""
    single = _single_stream(placements)
    rows = []
    for p in placements:
        figures = (p.get("speed") or {}).get("concurrency")
        if not figures:
            continue
        row: dict[str, Any] = {
            "placement": p["name"],
            "stages": p.get("n_stages"),
            "forwarding": p.get("forwarding", "relayed"),
        }
        for level in figures["levels"]:
            row[f"{level['sessions']} at once: tok/s"] = _cell(level, single)
        rows.append(row)
    if not rows:
        return None
    levels = sorted({int(k.split()[0]) for r in rows for k in r if k.endswith("at once: tok/s")})
    columns = ["placement", "stages", "forwarding", *(f"{c} at once: tok/s" for c in levels)]
    return pd.DataFrame(rows, columns=columns).fillna("—")


def concurrency_note(placements: Sequence[Mapping[str, Any]]) -> str | None:
    single = _single_stream(placements)
    return None if single is None else f"{single:.1f} tok/s"
