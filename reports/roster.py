"""The report index's Roster section: the newest roster under the reports folder (`dgr roster` writes
``REPORTS/roster/<run-id>/roster.json``), verified when the page is made like every certificate is;
a roster that does not verify is named with its problem and its table is not shown."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import DgrError


@dataclass(frozen=True, kw_only=True)
class Shown:
    envelope: Path
    page: Path
    verified: bool
    problem: str = ""
    dev_key: bool = False
    summary: str = ""  # the summary line ("" when it does not verify)
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()  # each row's cells, as the roster's own page shows them
    made: str = ""
    seconds: float = 0.0
    identity: Mapping[str, str] = field(default_factory=dict[str, str])


def latest(reports: Path, keys: Mapping[str, Any]) -> Shown | None:
    """The newest roster (run ids sort by time), or None when there is none."""
    from certify import roster
    from certify.verify import verify

    found = sorted(p for p in reports.glob(f"roster/*/{roster.ENVELOPE_FILE}") if p.is_file())
    if not found:
        return None
    path = found[-1]
    page = path.parent / roster.TABLE_FILE
    try:
        v = verify(path, keys, subjects=False)
    except (DgrError, OSError) as exc:
        return Shown(envelope=path, page=page, verified=False, problem=getattr(exc, "message", str(exc)))
    if not v.ok or not v.roster:
        problem = "; ".join(f"{ln.what} {ln.detail}" for ln in v.failures) or "not a roster"
        return Shown(envelope=path, page=page, verified=False, problem=problem)
    pred = v.predicate
    return Shown(
        envelope=path,
        page=page,
        verified=True,
        dev_key=bool(pred["signer"]["dev_key"]),
        summary=roster.summary_line(pred["summary"]),
        columns=roster.COLUMNS,
        rows=tuple(roster.cells(r) for r in pred["rows"]),
        made=str(pred["made"]),
        seconds=float(pred["seconds"]),
        identity=dict(pred["identity"]),
    )
