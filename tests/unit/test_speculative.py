"""Speculative pipeline decoding's driver (pipeline/speculative.py) over real loopback fake workers.

The fake worker keeps its toy KV per position and takes positions back on ``rewind`` as the C++
worker does, and its batch rows are computed one by one, so a verify pass gives exactly the rows a
plain decode gives: the tokens and the logits must be bitwise the plain greedy run's, whatever was
drafted and whatever was rejected.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigurationError
from pipeline import drive, routes, speculative
from tests.unit.fake_stages import fake_command, fake_env, load_stubs
from worker.client import StageFailed
from worker.launcher import launch

PROMPT = [20, 21, 22]  # the toy's continuation of it changes token (most prompts repeat one)
N_DECODE = 12
PLACEMENTS = {"1": [(0, 12)], "3": [(0, 1), (1, 11), (11, 12)], "12": [(k, k + 1) for k in range(12)]}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


def _launch(stubs, tmp_path: Path, placement, *, max_rewind: int = 3, **faults: str):
    command = dataclasses.replace(fake_command(tmp_path), max_rewind=max_rewind)
    return launch(
        command,
        placement,
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=fake_env(stubs, **faults),
        call_deadline=20.0,
    )


def _plain(clients) -> drive.PromptTrace:
    return drive.run_placement(clients, [PROMPT], N_DECODE, all_logits=False).prompts[0]


def test_acceptance_keeps_drafts_up_to_the_first_miss_then_the_argmax() -> None:
    rows = np.eye(6, dtype=np.float32)[[2, 4, 1, 5]]  # argmax per row: 2, 4, 1, 5
    assert speculative.accept(rows, [2, 4, 1]) == (3, 5)
    assert speculative.accept(rows, [2, 0, 1]) == (1, 4)
    assert speculative.accept(rows, [9, 4, 1]) == (0, 2)
    assert speculative.accept(rows[:1], []) == (0, 2)


def test_known_drafter_offers_the_truth_at_acceptance_one_and_never_at_zero() -> None:
    truth = [5, 6, 7, 8, 9]
    assert speculative.KnownDrafter(truth).propose([5, 6], 2) == [7, 8]
    assert speculative.KnownDrafter(truth).propose(truth[:4], 3) == [9]
    wrong = speculative.KnownDrafter(truth, acceptance=0.0, n_vocab=9).propose([5], 3)
    assert wrong == [7, 8, 0]
    with pytest.raises(ConfigurationError, match="acceptance"):
        speculative.KnownDrafter(truth, acceptance=1.5)


@pytest.mark.parametrize("name", list(PLACEMENTS))
@pytest.mark.parametrize("forwarding", ["relayed", "chained"])
def test_verify_passes_give_the_plain_greedy_run_bitwise(
    stubs, tmp_path: Path, name: str, forwarding: str
) -> None:
    n = len(PLACEMENTS[name])
    with _launch(stubs, tmp_path, PLACEMENTS[name]) as p:
        plain = _plain(p.clients)
        for k in (1, 3):
            for acceptance in (1.0, 0.5, 0.0):
                drafter = speculative.KnownDrafter(plain.tokens, acceptance=acceptance, n_vocab=40, seed=k)
                got = speculative.run(
                    p.clients, PROMPT, N_DECODE, k=k, drafter=drafter, route=routes.spec_named(forwarding)
                )
                assert got.tokens == plain.tokens, (k, acceptance)
                assert np.array_equal(got.logits, plain.logits), (k, acceptance)
                assert sum(len(q.chosen) for q in got.passes) == N_DECODE - 1
                per_pass = 2 * n if forwarding == "relayed" else n + 1
                assert all(q.step.crossings == per_pass for q in got.passes)
                if acceptance == 1.0:
                    assert got.acceptance_rate == 1.0 and all(q.rewound == 0 for q in got.passes)
                    assert len(got.passes) == -(-(N_DECODE - 1) // (k + 1))
                    expected = per_pass * len(got.passes) / (N_DECODE - 1)
                    assert got.crossings_per_token == pytest.approx(expected)
                if acceptance == 0.0:
                    assert got.acceptance_rate == 0.0 and got.tokens_per_pass == 1.0
                    assert any(q.rewound == k for q in got.passes)


def test_a_rejected_draft_leaves_no_trace(stubs, tmp_path: Path) -> None:
    """Two runs that differ only in the drafts they had rejected give bitwise the same logits after."""
    with _launch(stubs, tmp_path, PLACEMENTS["3"]) as p:
        plain = _plain(p.clients)
        a, b = (
            speculative.run(
                p.clients,
                PROMPT,
                N_DECODE,
                k=3,
                drafter=speculative.KnownDrafter(
                    plain.tokens, acceptance=0.4, n_vocab=40, seed=3, wrong_by=by
                ),
            )
            for by in (1, 7)
        )
    assert [q.fed for q in a.passes] != [q.fed for q in b.passes]  # they fed different rejected tokens
    assert [q.accepted for q in a.passes] == [q.accepted for q in b.passes]
    assert any(q.rewound for q in a.passes)
    assert np.array_equal(a.logits, b.logits) and a.tokens == b.tokens == plain.tokens


def test_workers_that_cannot_take_back_k_positions_are_refused(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["3"], max_rewind=2) as p:
        with pytest.raises(ConfigurationError, match="take back fewer") as refused:
            speculative.run(p.clients, PROMPT, N_DECODE, k=3, drafter=speculative.KnownDrafter([]))
        assert "--max-rewind 3" in (refused.value.hint or "")
        session = drive.new_session("deep")
        p.clients[0].forward(session, 1, [0, 1, 2, 3], tokens=[1, 2, 3, 4])
        with pytest.raises(StageFailed) as caught:
            p.clients[0].forward(session, 1, [1], tokens=[5], rewind=True)
        assert caught.value.code == "FAILED_PRECONDITION" and "at most 2" in caught.value.detail
        with pytest.raises(StageFailed, match="do not continue"):
            p.clients[0].forward(session, 1, [3], tokens=[5])  # no rewind asked: out of order
        p.clients[0].forward(session, 1, [2], tokens=[5], rewind=True)


def test_a_ring_refuses_every_drafter_but_the_last_stages(stubs, tmp_path: Path) -> None:
    """The driver is off a ring's path: only the last stage's nextn block can draft there, and the fake
    workers hold none."""
    with _launch(stubs, tmp_path, PLACEMENTS["3"]) as p:
        with pytest.raises(ConfigurationError, match="NextnDrafter") as known:
            speculative.run(
                p.clients, PROMPT, 4, k=1, drafter=speculative.KnownDrafter([]), route=routes.Ring()
            )
        with pytest.raises(ConfigurationError, match="needs a last stage that drafts"):
            speculative.run(
                p.clients, PROMPT, 4, k=1, drafter=speculative.NextnDrafter(), route=routes.Ring()
            )
    assert "relayed or chained" in known.value.hint


@pytest.mark.parametrize("forwarding", ["relayed", "chained"])
def test_a_stage_killed_during_a_verify_pass_ends_the_run_naming_it(
    stubs, tmp_path: Path, forwarding: str
) -> None:
    with _launch(
        stubs, tmp_path, PLACEMENTS["3"], DGR_FAKE_FAULT="die-after-forwards:3", DGR_FAKE_FAULT_BEGIN="1"
    ) as p:
        drafter = speculative.KnownDrafter([1] * N_DECODE)
        started = time.perf_counter()
        with pytest.raises(StageFailed) as caught:
            speculative.run(
                p.clients, PROMPT, N_DECODE, k=3, drafter=drafter, route=routes.spec_named(forwarding)
            )
        elapsed = time.perf_counter() - started
    assert caught.value.stage == 1 and caught.value.code in ("DIED", "UNAVAILABLE"), caught.value
    # the call deadline is 20 s: ending well inside it means the death was seen, not waited out
    assert elapsed < 10.0, elapsed
