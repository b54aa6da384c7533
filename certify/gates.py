"""Gates as small check objects.

Each check has ``fails(current, reference) -> message | None`` over a mapping of measured figures
(``current`` for the placement under test, ``reference`` for the monolithic reference).  Every check
of every placement is evaluated; failures are collected and the verdict is decided once.
A figure that was not measured, or is NaN, fails: a missing number must never pass a gate.

Two parity gates hold two different claims, so a FAIL says which one broke:

* ``staging-parity`` (every lane): each placement against the monolithic run of the same lane, same
  binary, same prompts.  A FAIL means staging changed the computation.
* ``backend-agreement`` (every lane but the CPU reference): the lane's monolithic run against the CPU
  monolithic reference, teacher-forced.  A FAIL means the backend computes something else than the
  reference, and names the first cut whose boundary NMSE is out of bounds (where the divergence starts).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from certify.verdict import Result, Status
from manifests.recipe_model import BackendAgreement, Placement, Speed, StagingParity

Figures = Mapping[str, float]


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    metric: str
    limit: float
    op = "?"

    def value(self, current: Figures, reference: Figures | None) -> float | None:
        v = current.get(self.metric)
        return None if v is None else float(v)

    def holds(self, value: float) -> bool:
        raise NotImplementedError

    def fails(self, current: Figures, reference: Figures | None = None) -> str | None:
        value = self.value(current, reference)
        if value is None:
            return f"{self.name}: {self.metric} was not measured"
        if math.isnan(value):
            return f"{self.name}: {self.metric} is NaN"
        if not self.holds(value):
            return f"{self.name} {_fmt(value)} (limit {self.op} {_fmt(self.limit)})"
        return None

    def row(self, current: Figures, reference: Figures | None) -> dict[str, Any]:
        value = self.value(current, reference)
        message = self.fails(current, reference)
        return {
            "check": self.name,
            "metric": self.metric,
            "value": value,
            "op": self.op,
            "limit": self.limit,
            "ok": message is None,
            "message": message or "",
        }


@dataclass(frozen=True, kw_only=True)
class AtLeast(Check):
    op = ">="

    def holds(self, value: float) -> bool:
        return value >= self.limit


@dataclass(frozen=True, kw_only=True)
class AtMost(Check):
    op = "<="

    def holds(self, value: float) -> bool:
        return value <= self.limit


@dataclass(frozen=True, kw_only=True)
class RatioAtLeast(AtLeast):
    """current[metric] / reference[metric] >= limit (staged vs monolithic decode speed)."""

    def value(self, current: Figures, reference: Figures | None) -> float | None:
        if reference is None or reference.get(self.metric) is None or current.get(self.metric) is None:
            return None
        ref = float(reference[self.metric])
        return float(current[self.metric]) / ref if ref > 0 else math.nan

    def fails(self, current: Figures, reference: Figures | None = None) -> str | None:
        if reference is None or reference.get(self.metric) is None:
            return f"{self.name}: the reference {self.metric} was not measured"
        return super().fails(current, reference)


@dataclass(frozen=True, kw_only=True)
class NotApplicable(Check):
    """A check that cannot be held on this run, with the reason (e.g. the staged/monolithic ratio when
    the monolithic speed comes from a sealed reference measured on other hardware).  Its row says
    NOT_APPLICABLE and why; it neither passes nor fails the gate."""

    reason: str
    op = "n/a"

    def fails(self, current: Figures, reference: Figures | None = None) -> str | None:
        return None

    def row(self, current: Figures, reference: Figures | None) -> dict[str, Any]:
        return {
            "check": self.name,
            "metric": self.metric,
            "value": None,
            "op": self.op,
            "limit": self.limit,
            "ok": True,
            "status": "NOT_APPLICABLE",
            "message": f"NOT_APPLICABLE: {self.reason}",
        }


STAGING_PARITY = "staging-parity"
BACKEND_AGREEMENT = "backend-agreement"


def logit_parity_checks(parity: StagingParity) -> list[Check]:
    """The staging-parity checks on logits and greedy tokens (the depth gate holds these alone: a long
    prompt's boundaries are not kept)."""
    return [
        AtLeast(name="top-1 agreement", metric="top1_agreement", limit=parity.top1_agreement_min),
        AtMost(name="KL mean", metric="kl_mean", limit=parity.kl_mean_max),
        AtMost(name="KL max", metric="kl_max", limit=parity.kl_max_max),
        AtMost(name="logits NMSE", metric="logits_nmse", limit=parity.logits_nmse_max),
        AtLeast(name="greedy continuation match", metric="greedy_match", limit=parity.greedy_match_min),
    ]


def staging_parity_checks(parity: StagingParity, placement: Placement) -> list[Check]:
    checks = logit_parity_checks(parity)
    for cut in placement.cuts:
        checks.append(
            AtMost(
                name=f"boundary NMSE at layer {cut}",
                metric=f"boundary_nmse@{cut}",
                limit=parity.boundary_nmse_max,
            )
        )
    return checks


def backend_agreement_checks(limits: BackendAgreement, cuts: Iterable[int]) -> list[Check]:
    """Teacher-forced figures of a lane's monolithic run against the CPU reference (see
    certify.measure.agreement_figures).  Top-1 is held only on the clear-margin rows, and at least one
    such row must exist: a gate that counted nothing would pass by default."""
    checks: list[Check] = [
        AtLeast(name="rows with a clear top-1 margin", metric="clear_rows", limit=1),
        AtLeast(
            name="top-1 agreement (clear-margin rows)",
            metric="top1_agreement_clear",
            limit=limits.top1_agreement_min,
        ),
        AtMost(name="KL mean", metric="kl_mean", limit=limits.kl_mean_max),
        AtMost(name="KL max", metric="kl_max", limit=limits.kl_max_max),
        AtMost(name="logits NMSE", metric="logits_nmse", limit=limits.logits_nmse_max),
    ]
    for cut in sorted(cuts):
        checks.append(
            AtMost(
                name=f"boundary NMSE at layer {cut}",
                metric=f"boundary_nmse@{cut}",
                limit=limits.boundary_nmse_max,
            )
        )
    return checks


def divergence_start(figures: Figures, cuts: Iterable[int], limit: float) -> int | None:
    """The first cut (in layer order) whose boundary NMSE exceeds ``limit``: the residual entering that
    layer is the first one that differs, so the divergence starts in the layers just before it."""
    for cut in sorted(cuts):
        value = figures.get(f"boundary_nmse@{cut}")
        if value is None or math.isnan(value) or value > limit:
            return cut
    return None


def evaluate_agreement(
    lane: str,
    limits: BackendAgreement,
    cuts: Iterable[int],
    figures: Figures,
    *,
    duration_s: float = 0.0,
    placement: str | None = None,
) -> Result:
    """The backend-agreement Result; a FAIL's reason says where the divergence starts.  ``placement``:
    a staged placement held to a sealed reference of another lane or build (else the lane's monolithic
    run against the CPU's, ``<lane>-vs-cpu``)."""
    cuts = sorted(cuts)
    result = evaluate(
        BACKEND_AGREEMENT,
        placement or f"{lane}-vs-cpu",
        backend_agreement_checks(limits, cuts),
        figures,
        duration_s=duration_s,
    )
    start = divergence_start(figures, cuts, limits.boundary_nmse_max)
    details = {**result.details, "divergence_starts_at": start}
    reason = result.reason
    if result.status is Status.FAIL:
        where = (
            f"divergence starts before layer {start} (the first cut out of bounds)"
            if start is not None
            else "every cut is within bounds: the divergence starts after the last cut"
        )
        reason = f"{reason}; {where}"
    return dataclasses.replace(result, reason=reason, details=details)


def sections(results: Iterable[Result], figures: Mapping[str, Any]) -> dict[str, Any]:
    """The certificate's two parity claims, each with its own status and the results behind it."""
    results = list(results)
    ref = figures.get("reference") or {}
    agreement = figures.get("backend_agreement") or {}
    staging = [r for r in results if r.details.get("gate") == STAGING_PARITY]
    agreeing = [r for r in results if r.details.get("gate") == BACKEND_AGREEMENT]
    sealed = figures.get("sealed_reference") or {}
    where = {"sealed_sha256": sealed["sha256"]} if sealed else {}
    out: dict[str, Any] = {
        "staging_parity": {
            "status": _reduce(staging),
            "reference": {"lane": ref.get("lane", ""), "placement": ref.get("placement", ""), **where},
            "results": [r.name for r in staging],
        },
    }
    if sealed:
        out["sealed_reference"] = {
            "gate": sealed["gate"],
            "why": sealed["why"],
            "sha256": sealed["sha256"],
            "set": sealed["set"],
            "lane": sealed["lane"],
        }
        if sealed["gate"] != STAGING_PARITY:
            out["staging_parity"]["reason"] = sealed["why"]
    if not agreement.get("applies"):
        out["backend_agreement"] = {
            "applies": False,
            "status": "NOT_APPLICABLE",
            "reason": agreement.get("reason", "not measured"),
        }
        return out
    out["backend_agreement"] = {
        "applies": True,
        "status": _reduce(agreeing),
        "reference": {
            "lane": agreement.get("reference_lane", ""),
            "placement": agreement.get("placement", ""),
            **where,
        },
        "teacher_forced": bool(agreement.get("teacher_forced")),
        "divergence_starts_at": agreement.get("divergence_starts_at"),
        "results": [r.name for r in agreeing],
    }
    return out


def _reduce(results: Sequence[Result]) -> str:
    if not results:
        return Status.SKIPPED.value
    return Status.FAIL.value if any(r.status is not Status.PASS for r in results) else Status.PASS.value


# A seam measured faster than its physical bound was not shaped as the recipe says (the bound counts
# payload bytes only; headers and jitter around the delay can only add): not a threshold to tune.
SEAM_BOUND_FLOOR = 0.95


def speed_checks(
    speed: Speed, placement: Placement, *, ratio_not_applicable: str = "", concurrency: bool = False
) -> list[Check]:
    """``ratio_not_applicable``: why the staged/monolithic ratio cannot be held (no monolithic speed of
    this machine: a sealed reference made elsewhere); the ratio's row then says NOT_APPLICABLE.
    ``concurrency``: the recipe decodes several sessions at once; none may differ from one alone."""
    checks = _speed_limits(speed, placement, ratio_not_applicable)
    if concurrency:
        checks.append(
            AtMost(name="concurrent sessions unlike one alone", metric="concurrency_diverging", limit=0.0)
        )
    return checks


def _speed_limits(speed: Speed, placement: Placement, ratio_not_applicable: str) -> list[Check]:
    if placement.seams:
        # Shaped seams: the monolithic reference runs on loopback, so an absolute floor or a ratio to
        # it says nothing; what the links allow (pipeline.physics) is the reference instead.
        assert speed.seam_bound_factor_max is not None and speed.bound_efficiency_min is not None
        return [
            AtMost(
                name="slowest seam / its physical bound",
                metric="seam_ratio_max",
                limit=speed.seam_bound_factor_max,
            ),
            AtLeast(
                name="fastest seam / its physical bound (shaping applied)",
                metric="seam_ratio_min",
                limit=SEAM_BOUND_FLOOR,
            ),
            AtLeast(
                name="decode: physical bound / measured time",
                metric="bound_efficiency",
                limit=speed.bound_efficiency_min,
            ),
        ]
    checks: list[Check] = [
        AtLeast(name="decode tok/s (median)", metric="decode_tok_s", limit=speed.decode_tok_s_min)
    ]
    if speed.prefill_tok_s_min is not None:
        checks.append(
            AtLeast(name="prefill tok/s (median)", metric="prefill_tok_s", limit=speed.prefill_tok_s_min)
        )
    if not placement.is_monolithic and ratio_not_applicable:
        checks.append(
            NotApplicable(
                name="staged/monolithic decode",
                metric="decode_tok_s",
                limit=speed.ratio_min(placement.n_stages),
                reason=ratio_not_applicable,
            )
        )
    elif not placement.is_monolithic:
        checks.append(
            RatioAtLeast(
                name="staged/monolithic decode",
                metric="decode_tok_s",
                limit=speed.ratio_min(placement.n_stages),
            )
        )
    return checks


def evaluate(
    gate: str,
    placement: str,
    checks: Iterable[Check],
    current: Figures,
    reference: Figures | None = None,
    *,
    duration_s: float = 0.0,
) -> Result:
    """One Result per (gate, placement) carrying every row; the reason lists every failing check."""
    rows = [c.row(current, reference) for c in checks]
    failed = [r["message"] for r in rows if not r["ok"]]
    return Result(
        name=f"{gate}/{placement}",
        status=Status.FAIL if failed else Status.PASS,
        reason="; ".join(failed),
        duration_s=duration_s,
        details={"gate": gate, "placement": placement, "rows": rows},
    )


def _fmt(x: float) -> str:
    if x == 0 or (1e-3 <= abs(x) < 1e6):
        return f"{x:.4g}"
    return f"{x:.3e}"
