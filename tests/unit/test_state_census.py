"""The state census's figures and the state-at-depth gate (certify/state.py), on counts as the workers
report them: a stage whose counts differ from the monolithic worker's is named, the recipe's
conditioning holds the monolithic census, and a figure that was not counted fails."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import cast

import pytest

from certify import state
from certify.verdict import Status
from manifests.recipe_model import Exercised, Placement
from worker.client import LayerState, StageInfo


def hca(il: int, entries: int) -> LayerState:
    return LayerState(
        layer=il,
        kind="hca",
        entries_held=entries,
        rows=4400,
        candidates_max=0,
        selected_at_max=0,
        excluding_rows=0,
        window_max=16,
        raw_cells=512,
    )


def csa(il: int, candidates: int, selected: int) -> LayerState:
    return LayerState(
        layer=il,
        kind="csa",
        entries_held=candidates,
        rows=4400,
        candidates_max=candidates,
        selected_at_max=selected,
        excluding_rows=4000,
        window_max=16,
        raw_cells=512,
    )


MONO = (csa(2, 1092, 4), hca(3, 34), csa(4, 1092, 4), hca(5, 34))
SPLIT = Placement(name="split", stages=((0, 4), (4, 6)))
ASKED = Exercised(compressed_entries_min=32, indexer_selected_max=0.25)


def stages(*censuses: tuple[LayerState, ...]) -> list[StageInfo]:
    return [cast(StageInfo, SimpleNamespace(census=c)) for c in censuses]


def test_the_summary_takes_each_kind_at_its_least_filled_layer() -> None:
    kinds = state.summary((*MONO[:3], hca(5, 30)))["kinds"]
    assert kinds["hca"]["entries_min"] == 30 and kinds["hca"]["entries_max"] == 34
    assert kinds["hca"]["layers"] == [3, 5]
    assert kinds["csa"]["candidates_max"] == 1092 and kinds["csa"]["excluding_rows"] == 8000
    assert kinds["csa"]["selected_fraction_max"] == pytest.approx(4 / 1092)


def test_a_kind_no_layer_showed_is_stated_as_nothing_filled() -> None:
    kinds = state.summary((csa(2, 11, 4),), state.KINDS)["kinds"]
    assert kinds["hca"] == {"layers": [], "entries_min": 0, "entries_max": 0, "window_max": 0, "raw_cells": 0}
    assert state.summary(())["kinds"] == {}


def test_the_census_of_several_stages_is_in_layer_order() -> None:
    infos = stages((MONO[2], MONO[3]), (MONO[0], MONO[1]))
    assert [s.layer for s in state.census_of(infos)] == [2, 3, 4, 5]


def test_a_placement_counting_what_the_monolithic_worker_counted_passes() -> None:
    result = state.judge(SPLIT, MONO, stages(MONO[:2], MONO[2:]), ASKED)
    assert result.status is Status.PASS, result.reason
    assert [r["ok"] for r in result.details["rows"]] == [True, True, True]


def test_a_stage_that_filled_fewer_entries_is_named_with_its_layer() -> None:
    short = (MONO[2], dataclasses.replace(MONO[3], entries_held=33))
    result = state.judge(SPLIT, MONO, stages(MONO[:2], short), ASKED)
    assert result.status is Status.FAIL
    assert "stage 1 (layers 4:6): layer 5: entries_held 33 (monolithic 34)" in result.reason


def test_a_stage_counting_another_stages_layer_or_missing_its_own_is_named() -> None:
    result = state.judge(SPLIT, MONO, stages(MONO[:3], MONO[3:]), None)
    assert result.status is Status.FAIL
    assert "stage 0 (layers 0:4): counted layer 4, which is not its own" in result.reason
    assert "stage 1 (layers 4:6): layer 4 filled no state" in result.reason


def test_the_conditioning_fails_a_short_context_and_an_indexer_that_keeps_everything() -> None:
    shallow = (csa(2, 4, 4), hca(3, 0), csa(4, 4, 4), hca(5, 0))  # the recipe's own prompts on tiny-v4
    result = state.judge(SPLIT, shallow, stages(shallow[:2], shallow[2:]), ASKED)
    assert result.status is Status.FAIL
    assert "ratio-128 entries, least-filled layer 0 (limit >= 32)" in result.reason
    assert "widest row 1 (limit <= 0.25)" in result.reason


def test_a_model_without_compressed_caches_fails_a_recipe_that_asks_for_them() -> None:
    result = state.judge(SPLIT, (), stages((), ()), ASKED)
    assert result.status is Status.FAIL
    assert "ratio-128 entries, least-filled layer 0 (limit >= 32)" in result.reason
    assert "widest row: indexer_selected_fraction_max was not measured" in result.reason
