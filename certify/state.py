"""State exercised (docs/gates.md, "Depth"): how much of a model's compressed and sliding-window state a
certification's passes actually filled, counted by the workers themselves (``--census``,
worker/src/state_census.h), and the ``state-at-depth`` gate.

A PASS that never fills DeepSeek V4's compressed caches does not certify them: a short prompt never
completes a ratio-128 block, and an indexer with fewer candidates than its top-k selects them all.  The
census reads each layer's attention masks as the graph computed them, so the certificate states what
the run filled (compressed entries per layer, the indexer's candidates and selections, the window's
entries), not what its positions should have filled.  Two records:

* ``figures["state"]``: the recipe's own prompts on the monolithic worker (what a certificate without a
  depth scenario covers: on tiny-v4 no ratio-128 entry at all);
* each placement at depth, and the monolithic worker there, under ``figures["depth"]``; the gate holds
  each placement's census, layer by layer, to the monolithic worker's (a stage that filled another
  stage's layers, or missed some of its own, is named), and the monolithic census to the recipe's
  ``depth.exercised`` conditioning (the longest prompt fills every ratio-128 layer with at least
  ``compressed_entries_min`` entries; the indexer keeps at most ``indexer_selected_max`` of its widest
  row's candidates).

Only architectures whose graphs name these caches are counted (``CENSUS_ARCHITECTURES``); for the others
the census would be empty, and the record says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from certify import gates
from certify.measure import Outcome, Plan
from certify.verdict import Result, Status
from manifests.recipe_model import Exercised, Placement
from pipeline import drive
from worker.client import LayerState, StageInfo

STATE_AT_DEPTH = "state-at-depth"
CENSUS_ARCHITECTURES = frozenset({"deepseek4"})
# the kinds of layer the census counts; a layer whose cache holds no entry yet computes plain window
# attention and names no compressed node (at fewer than 128 positions no ratio-128 layer is counted)
KINDS = ("csa", "hca")
# the fields two runs of the same passes at the same depth must agree on (maxima, not counts of rows:
# a staged placement also re-runs its longest prompt on the other prefill route)
_COMPARED = ("kind", "entries_held", "candidates_max", "selected_at_max", "window_max", "raw_cells")


def census_of(infos: Sequence[StageInfo]) -> tuple[LayerState, ...]:
    """Every stage's counted layers, in layer order."""
    return tuple(sorted((s for i in infos for s in i.census), key=lambda s: s.layer))


def summary(census: Sequence[LayerState], kinds_counted: Sequence[str] = ()) -> dict[str, Any]:
    """Per kind of layer, what the run filled (the least-filled layer is the figure that matters), and
    every layer's own counts.  A kind in ``kinds_counted`` that no layer showed filled nothing: zeros."""
    kinds: dict[str, Any] = {}
    for kind in sorted({*kinds_counted, *(s.kind for s in census)}):
        layers = [s for s in census if s.kind == kind]
        kinds[kind] = {
            "layers": [s.layer for s in layers],
            "entries_min": min((s.entries_held for s in layers), default=0),
            "entries_max": max((s.entries_held for s in layers), default=0),
            "window_max": max((s.window_max for s in layers), default=0),
            "raw_cells": max((s.raw_cells for s in layers), default=0),
        }
        if kind == "csa":
            kinds[kind] |= _indexer(layers)
    return {"kinds": kinds, "layers": [dataclasses.asdict(s) for s in census]}


def _indexer(layers: Sequence[LayerState]) -> dict[str, Any]:
    """The lightning indexer's widest rows: candidates, selections, and the largest share selected."""
    fractions = [s.selected_at_max / s.candidates_max for s in layers if s.candidates_max > 0]
    return {
        "candidates_max": max((s.candidates_max for s in layers), default=0),
        "selected_fraction_max": max(fractions, default=None),
        "excluding_rows": sum(s.excluding_rows for s in layers),
    }


def prompts_census(plan: Plan, out: Outcome) -> None:
    """The recipe's own prompts (prefill and decode as the parity gate runs them) on a monolithic worker
    started with --census: ``out.figures["state"]``.  Workers attached or a sealed reference are not
    ours to start with it; a model whose architecture names no compressed cache has nothing to count."""
    recipe = plan.recipe
    if plan.pipelines is not None or plan.sealed is not None:
        out.figures["state"] = {"applies": False, "reason": "the workers were not started by this run"}
        return
    if recipe.architecture not in CENSUS_ARCHITECTURES:
        reason = f"{recipe.architecture} keeps no compressed cache to count"
        out.figures["state"] = {"applies": False, "reason": reason}
        return
    cmd = dataclasses.replace(plan.worker, census=True)
    mono = recipe.monolithic
    with plan.where().start(cmd, mono, f"census-{mono.name}") as pipe:
        prompts = [pipe.clients[0].tokenize(text) for text in recipe.prompts.texts]
        drive.run_placement(pipe.clients, prompts, recipe.n_decode)
        census = census_of(drive.describe(pipe.clients))
    longest = max(len(p) for p in prompts) + recipe.n_decode
    out.figures["state"] = {"applies": True, "positions_max": longest, **summary(census, KINDS)}


def judge(
    p: Placement, mono: Sequence[LayerState], staged: Sequence[StageInfo], exercised: Exercised | None
) -> Result:
    """``state-at-depth`` for one placement: each stage's census equals the monolithic worker's for its
    layers (a FAIL names the stage and the layer), and the monolithic census meets the recipe's
    conditioning where it sets one (a figure that was not counted fails)."""
    mismatches = _stage_mismatches(p, mono, staged)
    kinds: Mapping[str, Any] = summary(mono, KINDS)["kinds"]
    figures = {
        "layers_off": len(mismatches),
        "hca_entries_min": (kinds.get("hca") or {}).get("entries_min"),
        "indexer_selected_fraction_max": (kinds.get("csa") or {}).get("selected_fraction_max"),
    }
    checks: list[gates.Check] = [
        gates.AtMost(name="layers counted otherwise than the monolithic worker", metric="layers_off", limit=0)
    ]
    if exercised is not None:
        checks += [
            gates.AtLeast(
                name="ratio-128 entries, least-filled layer",
                metric="hca_entries_min",
                limit=exercised.compressed_entries_min,
            ),
            gates.AtMost(
                name="share of its candidates the indexer selected, widest row",
                metric="indexer_selected_fraction_max",
                limit=exercised.indexer_selected_max,
            ),
        ]
    result = gates.evaluate(STATE_AT_DEPTH, p.name, checks, figures)
    if result.status is Status.PASS:
        return result
    return dataclasses.replace(result, reason="; ".join([*mismatches, result.reason]))


def _stage_mismatches(p: Placement, mono: Sequence[LayerState], staged: Sequence[StageInfo]) -> list[str]:
    by_layer = {s.layer: s for s in mono}
    problems = []
    for k, ((begin, end), info) in enumerate(zip(p.stages, staged, strict=True)):
        counted = {s.layer: s for s in info.census}
        expected = {il: s for il, s in by_layer.items() if begin <= il < end}
        for il in sorted(set(counted) | set(expected)):
            why = _layer_mismatch(il, counted.get(il), expected.get(il))
            if why:
                problems.append(f"stage {k} (layers {begin}:{end}): {why}")
    return problems


def _layer_mismatch(il: int, got: LayerState | None, want: LayerState | None) -> str | None:
    if want is None:
        return f"counted layer {il}, which is not its own"
    if got is None:
        return f"layer {il} filled no state (the monolithic worker's {want.entries_held} {want.kind} entries)"
    off = [f for f in _COMPARED if getattr(got, f) != getattr(want, f)]
    return (
        f"layer {il}: " + ", ".join(f"{f} {getattr(got, f)} (monolithic {getattr(want, f)})" for f in off)
        if off
        else None
    )
