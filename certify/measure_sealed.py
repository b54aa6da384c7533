"""Certify against a sealed reference (certify.sealed): every staged placement, no monolithic worker.

The sealed reference stands where the live monolithic run stands in ``certify.measure.run``: its trace
is what staging parity compares with (same lane and build key), or what each placement is held to by
the backend-agreement gate, teacher-forced on its tokens (another lane or build).  Its speed and route
change are used only where they mean the same thing as a live run's (``Sealed.mode_for``); the
checks that cannot be held say NOT_APPLICABLE and why.
"""

from __future__ import annotations

import dataclasses

from certify import gates, measure
from certify.measure import Outcome, Plan
from certify.sealed import BACKEND_AGREEMENT
from certify.verdict import Result, Status
from core.errors import ConfigurationError


def run(plan: Plan) -> Outcome:
    """Every staged placement against the plan's sealed reference; the monolithic placement is not run."""
    sealed = plan.sealed
    if sealed is None:
        raise ValueError("certify.measure_sealed runs plans with a sealed reference")
    out = Outcome()
    recipe, hc, mono = plan.recipe, plan.hardware_class, plan.recipe.monolithic
    mode = sealed.mode_for(plan.lane, plan.build_key, plan.fingerprint, plan.started_threads())
    limits = hc.backend_agreement if mode.gate == BACKEND_AGREEMENT else None
    if mode.gate == BACKEND_AGREEMENT and limits is None:
        raise ConfigurationError(
            f"recipe {recipe.name}: {mode.why}, but hardware class {hc.name} has no backend_agreement limits",
            hint="certify against a reference made by this lane and build, or add the limits to the recipe",
        )
    same = mode.gate != BACKEND_AGREEMENT
    ref = measure.Reference(
        trace=sealed.trace,
        prompts=sealed.prompts,
        speed=sealed.speed if mode.speed_carried else None,
        route=sealed.route if same else None,
    )
    measure.reference_figures(plan, ref, out, lane=sealed.lane, sealed=sealed.record["sha256"])
    out.figures["sealed_reference"] = {
        **dict(sealed.record),
        "gate": mode.gate,
        "why": mode.why,
        "speed_carried": mode.speed_carried,
        "speed_reason": mode.speed_reason,
        "monolithic_worker_started": False,
    }
    out.figures["placements"] = [
        {
            "name": mono.name,
            "stages": [list(s) for s in mono.stages],
            "n_stages": 1,
            "cuts": [],
            "boundary_dtype": "f32",
            "lane": sealed.lane,
            "role": "sealed reference",
            "speed": sealed.speed,
        }
    ]
    out.results.append(
        Result(
            name=f"reference/{mono.name}",
            status=Status.PASS,
            reason=mode.why,
            details={"lane": sealed.lane, "sealed_sha256": sealed.record["sha256"], "gate": mode.gate},
        )
    )
    if mode.speed_carried:
        carried = gates.evaluate(
            "speed", mono.name, gates.speed_checks(hc.speed, mono), measure.gate_figures(None, sealed.speed)
        )
        carried_from = {**carried.details, "carried_from": "sealed reference"}
        reason = carried.reason and (
            f"{carried.reason} (the sealed reference's monolithic speed, measured when it was made, run "
            f"{sealed.header.get('run_id')}: make the reference again on an idle machine)"
        )
        out.results.append(dataclasses.replace(carried, details=carried_from, reason=reason))
    else:
        out.results.append(
            Result(
                name=f"speed/{mono.name}",
                status=Status.SKIPPED,
                reason=f"NOT_APPLICABLE: {mode.speed_reason}",
            )
        )
    if same and plan.lane != "cpu" and hc.agreement_for(plan.lane) is not None:
        reason = (
            "the sealed reference is this lane's own; its agreement with a CPU reference is checked "
            "between references (`dgr reference --compare CPU_REF LANE_REF`)"
        )
    elif same:
        reason = f"lane {plan.lane} is the reference every other lane is held to"
    else:
        reason = ""
    if reason:
        out.figures["backend_agreement"] = {"applies": False, "reason": reason}
    else:
        out.figures["backend_agreement"] = {
            "applies": True,
            "lane": plan.lane,
            "reference_lane": sealed.lane,
            "placement": f"sealed {mono.name}",
            "teacher_forced": True,
            "cuts": sorted({c for p in recipe.staged for c in p.cuts}),
            "divergence_starts_at": None,
            "per_placement": True,
        }
    measure.staged_placements(plan, ref, out, mode=mode, agreement=limits)
    measure.finish(recipe, out)
    return out
