"""Certifying attached workers: the recipe cut to the placements a placement file lists (a SKIPPED
result for each other one), and the measurement plan run on those workers instead of ours."""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from certify.verdict import Result, Status
from core.errors import ConfigurationError
from manifests.placement_file import PlacementFile
from manifests.recipe_model import Recipe
from pipeline.attached import AttachedPipelines
from pipeline.worker_identity import model_shape


def restrict(
    pf: PlacementFile, recipe: Recipe, lane: str, *, cross_lane: bool, sealed: bool = False
) -> tuple[Recipe, list[Result]]:
    """The recipe cut to the placements the file lists, and a SKIPPED result for each one it does not.

    The reference (and the route-change placement) must be listed: without them nothing can pass.
    ``sealed``: the reference is a sealed one, so no monolithic (or CPU reference) workers are needed;
    the monolithic placement stays in the recipe as the name of what the sealed reference ran.
    """
    _check_recipe_and_lane(pf, recipe, lane)
    _check_placements(pf, recipe)
    _check_references(pf, recipe, lane, cross_lane=cross_lane, sealed=sealed)
    kept = {n: p for n, p in recipe.placements.items() if n in pf.placements or (sealed and p.is_monolithic)}
    skipped = [
        Result(
            name=f"placement/{n}",
            status=Status.SKIPPED,
            reason=f"not listed in the placement file {Path(pf.source).name}; no attached workers, not run",
        )
        for n in recipe.placements
        if n not in kept
    ]
    return dataclasses.replace(recipe, placements=types.MappingProxyType(kept)), skipped


def _check_recipe_and_lane(pf: PlacementFile, recipe: Recipe, lane: str) -> None:
    """Exit 2 when the file was written for another recipe, or for workers of another lane."""
    src = pf.source
    if pf.recipe != recipe.name:
        raise ConfigurationError(
            f"{src}: at /recipe: the file is for recipe {pf.recipe!r}, not {recipe.name!r}"
        )
    if pf.lane is not None and pf.lane != lane:
        raise ConfigurationError(f"{src}: at /lane: the file's workers run lane {pf.lane}, not --lane {lane}")


def _check_placements(pf: PlacementFile, recipe: Recipe) -> None:
    """Exit 2 unless every placement the file lists is the recipe's, with the recipe's very layers;
    an unknown name gets the likely one suggested."""
    src = pf.source
    for name, stages in pf.placements.items():
        if name not in recipe.placements:
            close = difflib.get_close_matches(name, list(recipe.placements), n=1)
            tip = (
                f" (did you mean {close[0]!r}?)"
                if close
                else f" (its placements: {', '.join(recipe.placements)})"
            )
            raise ConfigurationError(
                f"{src}: at /placements: recipe {recipe.name} has no placement {name!r}{tip}"
            )
        want = recipe.placements[name].stages
        got = tuple(s.layers for s in stages)
        if got != want:
            raise ConfigurationError(
                f"{src}: at /placements/{name}: layers {[list(g) for g in got]} are not the recipe's "
                f"{[list(w) for w in want]}"
            )


def _check_references(
    pf: PlacementFile, recipe: Recipe, lane: str, *, cross_lane: bool, sealed: bool
) -> None:
    """Exit 2 unless the file lists what every placement is compared with: the monolithic reference
    (unless a sealed one stands in), the route-change placement, and the CPU reference's workers
    when the lane is held to one."""
    src = pf.source
    needed = ([] if sealed else [recipe.monolithic.name]) + (
        [recipe.route_change.placement] if recipe.route_change else []
    )
    missing = [n for n in needed if n not in pf.placements]
    if missing:
        raise ConfigurationError(
            f"{src}: at /placements: {', '.join(missing)} must be listed (the monolithic reference every "
            "placement is compared to, and the route-change placement)"
        )
    if cross_lane and not sealed:
        if pf.reference is None:
            raise ConfigurationError(
                f"{src}: lane {lane} is compared against a CPU monolithic reference: list its workers under "
                '"reference" (started with --lane cpu)'
            )
        if tuple(s.layers for s in pf.reference) != recipe.monolithic.stages:
            raise ConfigurationError(
                f"{src}: at /reference: must own the monolithic range {list(recipe.monolithic.stages)}"
            )


def attach_plan(
    plan: Any, pf: PlacementFile, identity: Mapping[str, Any], ctx_size: int
) -> tuple[Any, AttachedPipelines, list[Result]]:
    """``plan`` (certify.measure.Plan) run on the file's workers: the recipe cut to the listed
    placements, stages attached instead of started; plus the SKIPPED results of the others."""
    sealed = getattr(plan, "sealed", None) is not None
    cross = plan.hardware_class.agreement_for(plan.lane) is not None and not sealed
    recipe, skipped = restrict(pf, plan.recipe, plan.lane, cross_lane=cross, sealed=sealed)
    pipes = AttachedPipelines(
        file=pf,
        recipe=plan.recipe,
        lane=plan.lane,
        identity=identity,
        stubs=plan.stubs,
        reference_lane="cpu" if cross else None,
        shape=model_shape(plan.worker.model),
        min_ctx=ctx_size,
        call_deadline=plan.call_deadline,
    )
    # The measurement picks the reference by its command's lane; no program is ever run from it.
    reference = dataclasses.replace(plan.worker, lane="cpu") if cross else plan.reference_worker
    return (
        dataclasses.replace(plan, recipe=recipe, pipelines=pipes, reference_worker=reference),
        pipes,
        skipped,
    )
