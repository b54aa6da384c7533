"""The report index: every certificate under the reports folder, and a lane x recipe matrix of
certified / failed / compile-only / never run, each cell linking to the latest report."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.context import Context
from core.errors import DgrError


@dataclass(frozen=True, kw_only=True)
class Entry:
    recipe: str
    lane: str
    run_id: str
    finished: str
    verdict: str  # PASS / FAIL / ? (unreadable)
    verified: bool
    problem: str
    recipe_digest: str
    certificate: Path
    html: Path
    dev_key: bool
    predicate: Mapping[str, Any] | None = None  # what a certificate that verified says (the catalog reads it)


def _field(pred: Mapping[str, Any], *keys: str, default: Any = "") -> Any:
    """``pred[k1][k2]...`` where every level is an object; ``default`` otherwise (a crafted or
    unverified certificate may put anything anywhere)."""
    value: Any = pred
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def scan(reports: Path, keys: Mapping[str, Any]) -> list[Entry]:
    from certify.verify import verify

    entries = []
    for path in sorted(reports.glob("*/*/*/certificate.json")):
        run_dir = path.parent
        lane, recipe = run_dir.parent.name, run_dir.parent.parent.name
        try:
            v = verify(path, keys, subjects=False)
        except (DgrError, OSError) as exc:
            # one certificate that cannot be read is listed as such; the others are still shown
            entries.append(
                Entry(
                    recipe=recipe,
                    lane=lane,
                    run_id=run_dir.name,
                    finished="",
                    verdict="?",
                    verified=False,
                    problem=getattr(exc, "message", None) or f"unreadable: {exc}",
                    recipe_digest="",
                    certificate=path,
                    html=run_dir / "report.html",
                    dev_key=False,
                )
            )
            continue
        pred = v.predicate
        problem = "; ".join(f"{ln.what} {ln.detail}" for ln in v.failures)
        # Where the certificate says something else than the folder it sits in, believe neither.
        certified = _field(pred, "recipe", "name", default=None)
        if pred and (pred.get("lane") != lane or certified != recipe):
            problem = problem or f"filed under {recipe}/{lane} but certifies {certified}/{pred.get('lane')}"
        page = _field(pred, "report", "file", default="report.html")
        entries.append(
            Entry(
                recipe=recipe,
                lane=lane,
                run_id=str(pred.get("run_id", run_dir.name)),
                finished=str(pred.get("finished", "")),
                verdict=str(_field(pred, "verdict", "status", default="?")),
                verified=not problem,
                problem=problem,
                recipe_digest=str(_field(pred, "recipe", "digest")),
                certificate=path,
                html=run_dir / (page if isinstance(page, str) and page else "report.html"),
                dev_key=bool(_field(pred, "signer", "dev_key", default=False)),
                predicate=pred,
            )
        )
    return entries


@dataclass(frozen=True, kw_only=True)
class Cell:
    state: str  # certified | failed | compile-only | never run
    note: str
    link: str | None


def cell(
    entries: Sequence[Entry],
    *,
    lane: str,
    recipe: str,
    digest: str | None,
    built: bool,
    listed: bool,
    root: Path,
) -> Cell:
    uncertified = "compile-only" if built else "never run"
    mine = sorted(
        (e for e in entries if e.lane == lane and e.recipe == recipe), key=lambda e: (e.finished, e.run_id)
    )
    if not mine:
        note = "not a lane of this recipe" if not listed else "built, no certificate" if built else ""
        return Cell(state=uncertified, note=note, link=None)
    last = mine[-1]
    link = os.path.relpath(last.html, root)
    if not last.verified:
        return Cell(state="failed", note=f"does not verify: {last.problem}", link=link)
    if digest is not None and last.recipe_digest != digest:
        note = f"last certificate ({last.verdict}, {last.finished}) is for an older recipe"
        return Cell(state=uncertified, note=note, link=link)
    if last.verdict == "PASS":
        note = f"{last.finished}{' (dev key)' if last.dev_key else ''}"
        return Cell(state="certified", note=note, link=link)
    return Cell(state="failed", note=f"{last.verdict} {last.finished}", link=link)


def certified_placements(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """The catalog's entries (certify/catalog.py: the newest PASS per lane, recipe, hardware class and
    placement) over the certificates scan found verified; `dgr catalog` signs the same."""
    from certify import catalog
    from certify.certificate import file_digests

    read = [
        catalog.Read(path=e.certificate, digests=file_digests(e.certificate), predicate=e.predicate)
        for e in entries
        if e.verified and e.predicate
    ]
    return catalog.build(read, [])["entries"] if read else []


def build_exists(ctx: Context, lane: str) -> bool:
    return any(ctx.workspace.builds.glob(f"{lane}-*/build.json"))


def render_index(ctx: Context, reports: Path) -> Path:
    from certify.keys import trusted_keys
    from core.canonical import atomic_write_bytes
    from lanes.base import LANE_NAMES
    from manifests import recipe_model as recipes
    from reports.render import environment
    from reports.roster import latest

    keys = trusted_keys(ws=ctx.workspace)
    entries = scan(reports, keys)
    names = sorted(set(recipes.available(ctx.env)) | {e.recipe for e in entries})
    loaded: dict[str, Any] = {}
    for name in names:
        try:
            loaded[name] = recipes.load(name, ctx.env)
        except DgrError:
            loaded[name] = None
    built = {lane: build_exists(ctx, lane) for lane in LANE_NAMES}
    matrix = [
        (
            lane,
            [
                cell(
                    entries,
                    lane=lane,
                    recipe=name,
                    digest=loaded[name].digest if loaded[name] else None,
                    built=built[lane],
                    listed=bool(loaded[name]) and lane in loaded[name].lanes,
                    root=reports,
                )
                for name in names
            ],
        )
        for lane in LANE_NAMES
    ]
    html = (
        environment()
        .get_template("index.html.j2")
        .render(
            recipes=names,
            matrix=matrix,
            entries=sorted(entries, key=lambda e: (e.finished, e.run_id), reverse=True),
            certified=certified_placements(entries),
            roster=latest(reports, keys),
            rel=lambda p: os.path.relpath(p, reports),
        )
    )
    out = reports / "index.html"
    if reports == ctx.workspace.reports:
        ctx.workspace.ensure(reports)  # our own folder: no link planted on the way
    else:
        reports.mkdir(parents=True, exist_ok=True)  # a folder the user named with --reports
    atomic_write_bytes(out, html.encode("utf-8"))
    out.chmod(0o644)
    return out
