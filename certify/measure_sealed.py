"""Certify against a sealed reference (certify.sealed): every staged placement, no monolithic worker.

The sealed reference stands where the live monolithic run stands in ``certify.measure.run``: its trace
is what staging parity compares with (same lane and build key), or what each placement is held to by
the backend-agreement gate, teacher-forced on its tokens (another lane or build).  Its speed and route
change are used only where they mean the same thing as a live run's (``Sealed.mode_for``); the
checks that cannot be held say NOT_APPLICABLE and why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from certify import gates, measure
from certify.measure import Outcome, Plan
from certify.sealed import BACKEND_AGREEMENT, Mode, Sealed
from certify.verdict import Result, Status
from core.errors import ConfigurationError
from manifests.recipe_model import BackendAgreement, HardwareClass, Placement


def run(plan: Plan) -> Outcome:
    """Every staged placement against the plan's sealed reference; the monolithic placement is not run."""
    sealed = plan.sealed
    if sealed is None:
        raise ValueError("certify.measure_sealed runs plans with a sealed reference")
    out = Outcome()
    mono = plan.recipe.monolithic
    mode, limits = _gate(plan, sealed)
    same = mode.gate != BACKEND_AGREEMENT
    ref = measure.Reference(
        trace=sealed.trace,
        prompts=sealed.prompts,
        speed=sealed.speed if mode.speed_carried else None,
        route=sealed.route if same else None,
    )
    measure.reference_figures(plan, ref, out, lane=sealed.lane, sealed=sealed.record["sha256"])
    out.figures["sealed_reference"] = _sealed_record(sealed, mode)
    out.figures["placements"] = [_sealed_placement(sealed, mono)]
    out.results.append(_reference_result(sealed, mode, mono))
    out.results.append(_speed_result(plan.hardware_class, sealed, mode, mono))
    out.figures["backend_agreement"] = _backend_agreement(plan, sealed, same)
    measure.staged_placements(plan, ref, out, mode=mode, agreement=limits)
    measure.finish(plan.recipe, out, tls=measure.tls_pair(plan.worker))
    return out


def _gate(plan: Plan, sealed: Sealed) -> tuple[Mode, BackendAgreement | None]:
    """Which gate holds the placements to the reference (Sealed.mode_for), and the class's
    backend-agreement limits when it is that gate; exit 2 when the class has none to apply."""
    recipe, hc = plan.recipe, plan.hardware_class
    mode = sealed.mode_for(plan.lane, plan.build_key, plan.fingerprint, plan.started_threads())
    limits = hc.backend_agreement if mode.gate == BACKEND_AGREEMENT else None
    if mode.gate == BACKEND_AGREEMENT and limits is None:
        raise ConfigurationError(
            f"recipe {recipe.name}: {mode.why}, but hardware class {hc.name} has no backend_agreement limits",
            hint="certify against a reference made by this lane and build, or add the limits to the recipe",
        )
    return mode, limits


def _sealed_record(sealed: Sealed, mode: Mode) -> dict[str, Any]:
    """The reference as the certificate names it: its record, the gate that held the placements to it
    and why, whether its speed was carried, and that no monolithic worker was started."""
    return {
        **dict(sealed.record),
        "gate": mode.gate,
        "why": mode.why,
        "speed_carried": mode.speed_carried,
        "speed_reason": mode.speed_reason,
        "monolithic_worker_started": False,
    }


def _sealed_placement(sealed: Sealed, mono: Placement) -> dict[str, Any]:
    """The monolithic placement's row in the placements figure, standing for the sealed reference (the
    report lists it where a live run lists its monolithic worker)."""
    return {
        "name": mono.name,
        "stages": [list(s) for s in mono.stages],
        "n_stages": 1,
        "cuts": [],
        "boundary_dtype": "f32",
        "lane": sealed.lane,
        "role": "sealed reference",
        "speed": sealed.speed,
    }


def _reference_result(sealed: Sealed, mode: Mode, mono: Placement) -> Result:
    """The reference itself passes: it was verified byte for byte and held to the run's identity
    before any worker started; the result says which gate holds the placements to it."""
    return Result(
        name=f"reference/{mono.name}",
        status=Status.PASS,
        reason=mode.why,
        details={"lane": sealed.lane, "sealed_sha256": sealed.record["sha256"], "gate": mode.gate},
    )


def _speed_result(hc: HardwareClass, sealed: Sealed, mode: Mode, mono: Placement) -> Result:
    """The monolithic speed gate on the reference's own speed where it was carried (same lane, build and
    hardware), else NOT_APPLICABLE with the reason: a speed from elsewhere says nothing about here."""
    if not mode.speed_carried:
        return Result(
            name=f"speed/{mono.name}",
            status=Status.SKIPPED,
            reason=f"NOT_APPLICABLE: {mode.speed_reason}",
        )
    carried = gates.evaluate(
        "speed", mono.name, gates.speed_checks(hc.speed, mono), measure.gate_figures(None, sealed.speed)
    )
    carried_from = {**carried.details, "carried_from": "sealed reference"}
    reason = carried.reason and (
        f"{carried.reason} (the sealed reference's monolithic speed, measured when it was made, run "
        f"{sealed.header.get('run_id')}: make the reference again on an idle machine)"
    )
    return dataclasses.replace(carried, details=carried_from, reason=reason)


def _backend_agreement(plan: Plan, sealed: Sealed, same: bool) -> dict[str, Any]:
    """The backend-agreement figure: per placement, teacher-forced on the reference's tokens, when the
    reference is another lane's or build's; else why it does not apply on this run."""
    if same and plan.lane != "cpu" and plan.hardware_class.agreement_for(plan.lane) is not None:
        reason = (
            "the sealed reference is this lane's own; its agreement with a CPU reference is checked "
            "between references (`dgr reference --compare CPU_REF LANE_REF`)"
        )
    elif same:
        reason = f"lane {plan.lane} is the reference every other lane is held to"
    else:
        reason = ""
    if reason:
        return {"applies": False, "reason": reason}
    return {
        "applies": True,
        "lane": plan.lane,
        "reference_lane": sealed.lane,
        "placement": f"sealed {plan.recipe.monolithic.name}",
        "teacher_forced": True,
        "cuts": sorted({c for p in plan.recipe.staged for c in p.cuts}),
        "divergence_starts_at": None,
        "per_placement": True,
    }
