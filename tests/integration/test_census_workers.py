"""The state census on real tiny-v4 workers (issue 41; worker/src/state_census.h): what a worker started
with --census counts is what the model's definition says its passes fill, a staged placement counts
exactly the monolithic worker's layers between its stages, a short prompt fills no ratio-128 block, and
counting changes no logit."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from certify import depth_prompt, state
from pipeline import drive
from pipeline.depth import DepthTrace, run_at_depth
from tests.integration.conftest import THREADS
from worker.client import LayerState
from worker.launcher import WorkerCommand, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = 1280  # ten ratio-128 blocks, in five passes of 256
DECODE = 8
CSA_LAYERS, HCA_LAYERS = [2, 4, 6, 8, 10], [3, 5, 7, 9]  # tiny-v4's compress_ratios 4 and 128
TOP_K, WINDOW = 4, 16  # its indexer_top_k and sliding_window


@pytest.fixture(scope="module")
def v4_depth(cpu_build, real_ctx) -> WorkerCommand:
    from fetch.provision import provision

    model = Path(provision(real_ctx, "tiny-v4").first)
    program = (os.fspath(cpu_build.worker),)
    return WorkerCommand(program=program, model=model, threads=THREADS, ctx_size=1536, batch=256, lane="cpu")


def _run(cmd, placement, prompt_tokens, stubs, env, evidence) -> tuple[DepthTrace, tuple[LayerState, ...]]:
    with launch(cmd, placement, stubs=stubs, evidence=evidence, env=env) as p:
        prompt = depth_prompt.prompts(7, [prompt_tokens], p.clients[0].tokenize)[prompt_tokens]
        trace = run_at_depth(p.clients, prompt, DECODE)
        return trace, state.census_of(drive.describe(p.clients))


def test_the_census_counts_what_the_passes_fill_and_changes_nothing(
    v4_depth, stubs, worker_env, tmp_path
) -> None:
    counted = dataclasses.replace(v4_depth, census=True)
    mono, census = _run(counted, [(0, 12)], PROMPT, stubs, worker_env, tmp_path / "mono")
    plain, none = _run(v4_depth, [(0, 12)], PROMPT, stubs, worker_env, tmp_path / "plain")
    assert none == ()  # no --census, no callback
    assert np.array_equal(mono.logits, plain.logits) and mono.tokens == plain.tokens
    positions = PROMPT + DECODE - 1  # the last chosen token is never fed
    by_kind = {k: [s for s in census if s.kind == k] for k in ("csa", "hca")}
    assert [s.layer for s in by_kind["csa"]] == CSA_LAYERS and [s.layer for s in by_kind["hca"]] == HCA_LAYERS
    for s in census:
        assert s.rows == positions and s.window_max == WINDOW and s.raw_cells == 1536, s
    for s in by_kind["hca"]:
        assert s.entries_held == positions // 128, s  # every completed block of 128 positions
    for s in by_kind["csa"]:
        assert s.entries_held == s.candidates_max == positions // 4 and s.selected_at_max == TOP_K, s
        assert s.excluding_rows == positions - 4 * TOP_K - 3, s  # every row with more candidates than k

    staged, split = _run(counted, [(0, 5), (5, 12)], PROMPT, stubs, worker_env, tmp_path / "staged")
    assert np.array_equal(staged.logits, mono.logits) and split == census


def test_a_short_prompt_fills_no_ratio_128_block(v4_depth, stubs, worker_env, tmp_path) -> None:
    counted = dataclasses.replace(v4_depth, census=True)
    _, census = _run(counted, [(0, 12)], 40, stubs, worker_env, tmp_path)
    assert {s.kind for s in census} == {"csa"}  # no ratio-128 block completed: those layers saw none
    assert state.summary(census, state.KINDS)["kinds"]["hca"]["entries_min"] == 0
    rows = 40 + DECODE - 1
    assert all(
        s.candidates_max == rows // 4 and s.excluding_rows == rows - 4 * TOP_K - 3
        for s in census
        if s.kind == "csa"
    )
