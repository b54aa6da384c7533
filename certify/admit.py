"""Admission: is a proposed split covered by a certified entry of a verified catalog?

A router proposes where a session's stages run: a recipe, a lane, the stages' layer ranges and the
artifacts it would load.  Only a split the catalog holds as PASS with the same artifacts, and on the
hardware class asked for when one is named, is admitted.  A cut of a certified recipe that was never
certified itself is refused and said to be such (the recipe's certified cuts are listed), never
admitted because its neighbours passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import GateFailed
from manifests.tiling import first_break


class NotAdmitted(GateFailed):
    """A proposed split the catalog does not cover (exit 5, as a failed gate)."""

    kind = "not admitted"


@dataclass(frozen=True, kw_only=True)
class Proposal:
    recipe: str
    lane: str
    stages: tuple[tuple[int, int], ...]  # [begin, end) per stage, in order
    artifacts_digest: str | None = None  # the manifest digest of the artifacts it would load
    recipe_digest: str | None = None  # the digest of the recipe it runs under; None: not compared
    hardware_class: str | None = None  # None: any class the catalog certified it on


@dataclass(frozen=True, kw_only=True)
class Admission:
    admitted: bool
    reason: str  # why, in one line: the entry that covers it, or what is missing
    entry: Mapping[str, Any] | None = None


def admit(catalog: Mapping[str, Any], proposal: Proposal) -> Admission:
    """Admitted only by a PASS entry of the same recipe, lane (class) and layer ranges, with the same
    artifacts and, where the proposal names one, the same recipe digest (the thresholds and scenario
    the split was held to)."""
    same = [e for e in catalog.get("entries", []) if _same_run_kind(e, proposal)]
    what = f"recipe {proposal.recipe} on lane {proposal.lane}" + (
        f", hardware class {proposal.hardware_class}" if proposal.hardware_class else ""
    )
    if not same:
        return Admission(
            admitted=False,
            reason=f"{what}: no certified placement in the catalog{_failed(catalog, proposal)}",
        )
    cut = [e for e in same if _ranges(e) == [list(s) for s in proposal.stages]]
    if not cut:
        return Admission(
            admitted=False,
            reason=f"{what}: layers {_text(proposal.stages)} {_uncertified(same, proposal.stages)}",
        )
    entry = cut[0]
    certified_with = entry["identity"]["artifacts"].get("manifest_digest")
    if proposal.artifacts_digest is not None and proposal.artifacts_digest != certified_with:
        return Admission(
            admitted=False,
            reason=f"{what}: placement {entry['placement']} was certified with artifacts {certified_with}, "
            f"this split would load {proposal.artifacts_digest}",
        )
    certified_under = entry["identity"].get("recipe_digest")
    if proposal.recipe_digest is not None and proposal.recipe_digest != certified_under:
        return Admission(
            admitted=False,
            reason=f"{what}: placement {entry['placement']} was certified under recipe digest "
            f"{certified_under}, the recipe now has {proposal.recipe_digest} (a threshold or scenario "
            "changed: certify it again)",
        )
    cert = entry["certificate"]
    unchecked = "" if proposal.recipe_digest is not None else "; recipe digest not compared"
    return Admission(
        admitted=True,
        reason=f"{what}: layers {_text(proposal.stages)} are placement {entry['placement']}, certified "
        f"(run {cert['run_id']}, {cert['finished']}, hardware class {entry['hardware_class']}){unchecked}",
        entry=entry,
    )


def _same_run_kind(entry: Mapping[str, Any], p: Proposal) -> bool:
    if (entry.get("recipe"), entry.get("lane")) != (p.recipe, p.lane):
        return False
    return p.hardware_class is None or entry.get("hardware_class") == p.hardware_class


def _ranges(entry: Mapping[str, Any]) -> list[list[int]]:
    return [list(s["layers"]) for s in entry.get("stages", [])]


def _text(stages: Sequence[Sequence[int]]) -> str:
    return " ".join(f"{b}:{e}" for b, e in stages)


def _uncertified(same: Sequence[Mapping[str, Any]], stages: Sequence[tuple[int, int]]) -> str:
    """The refusal of a cut of a certified recipe: not a split of its layers at all, or one inside its
    space that was not itself certified (the certified cuts named)."""
    n_layer = max(end for e in same for _, end in _ranges(e))
    if not stages or first_break(stages, n_layer) is not None:
        return f"are not a split of this recipe's {n_layer} layers (from 0 to {n_layer}, each after the last)"
    certified = "; ".join(f"{e['placement']} ({_text(_ranges(e))})" for e in same)
    return f"are a split of this recipe that was not itself certified; certified: {certified}"


def _failed(catalog: Mapping[str, Any], p: Proposal) -> str:
    """What the catalog says failed for this recipe and lane, so a refusal names it."""
    failed = sorted({e["placement"] for e in catalog.get("failures", []) if _same_run_kind(e, p)})
    return f" (failed: {', '.join(failed)})" if failed else ""
