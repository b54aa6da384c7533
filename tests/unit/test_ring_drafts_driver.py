"""Drafting rings, the driver's side (pipeline/ring_drafts.py, pipeline/ring.py ``draft``).

First the driver's check of single deliveries: real pb2 messages from the generated stubs and a real
StageClient (never dialed) for the failures; each delivery is built the way the C++ worker's last
stage builds one (worker/src/ring.cpp ``ring_step``).  Then whole rings over real loopback fake
workers (fake_shard_worker.py ``--mtp``: a stand-in nextn block drafting copies of the bonus token,
so some drafts stand and some are rejected): the tokens and logits of plain greedy decoding, the
chained speculative run's passes, the budget and stop tokens inside a pass, refusals, a killed stage.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigurationError
from pipeline import drive, ring, routes, speculative
from pipeline.ring_drafts import DraftedPasses
from pipeline.sink import ChainedPass
from tests.unit.fake_stages import fake_command, fake_env, load_stubs
from worker.client import StageClient, StageFailed
from worker.launcher import launch

N_VOCAB = 16
K = 3


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture
def last(stubs) -> StageClient:
    return StageClient("127.0.0.1:1", stubs.pb2, stubs.pb2_grpc, stage=2, layers=(8, 12))


def _rows(picks: list[int]) -> np.ndarray:
    rows = np.zeros((len(picks), N_VOCAB), dtype=np.float32)
    rows[np.arange(len(picks)), picks] = 1.0
    return rows


def _delivery(
    stubs,
    chosen: list[int],
    *,
    drafted: int,
    accepted: int,
    next_drafts=(),
    picks=None,
    token: int | None = None,
):
    ring = stubs.pb2.RingToken(token=chosen[-1] if token is None else token, tokens=chosen, drafted=drafted)
    passed = ChainedPass(
        logits=_rows(chosen if picks is None else picks),
        hops=(),
        boundaries=(),
        wall_seconds=0.01,
        draft=tuple(next_drafts),
        accepted=accepted,
    )
    return ring, passed


def test_accepted_drafts_and_the_bonus_token_are_taken_and_the_next_drafts_fed(stubs, last) -> None:
    check = DraftedPasses(last, 4, [5, 6, 7], K)
    got = check.take(*_delivery(stubs, [5, 6, 9], drafted=3, accepted=2, next_drafts=[1, 2, 3]), "continues")
    assert got.fed == (4, 5, 6, 7) and got.accepted == 2 and got.chosen == (5, 6, 9)
    again = check.take(*_delivery(stubs, [1, 2, 3, 11], drafted=3, accepted=3, next_drafts=[8]), "continues")
    assert again.fed == (9, 1, 2, 3) and again.chosen == (1, 2, 3, 11)
    last_pass = check.take(*_delivery(stubs, [8], drafted=1, accepted=1), "stop_token")
    assert last_pass.fed == (11, 8) and last_pass.chosen == (8,)  # cut by the stop token before its bonus


@pytest.mark.parametrize(
    "case",
    [
        "argmax",
        "overcount",
        "undercount",
        "short-pass",
        "token",
        "drafted",
        "rows",
        "too-many-drafts",
    ],
)
def test_a_delivery_the_driver_cannot_recompute_is_refused(stubs, last, case: str) -> None:
    check = DraftedPasses(last, 4, [5, 6, 7], K)
    bad = {
        "argmax": _delivery(stubs, [5, 9], drafted=3, accepted=1, picks=[5, 10]),
        "overcount": _delivery(stubs, [5, 9], drafted=3, accepted=2),  # 6 was drafted, 9 chosen: a miss
        "undercount": _delivery(stubs, [5, 6, 9], drafted=3, accepted=1),
        "short-pass": _delivery(stubs, [5], drafted=3, accepted=2),  # not cut, yet fewer than accepted + 1
        "token": _delivery(stubs, [5, 9], drafted=3, accepted=1, token=5),
        "drafted": _delivery(stubs, [5, 9], drafted=2, accepted=1),
        "rows": (
            _delivery(stubs, [5, 9], drafted=3, accepted=1)[0],
            _delivery(stubs, [5], drafted=3, accepted=0)[1],
        ),
        "too-many-drafts": _delivery(stubs, [5, 9], drafted=3, accepted=1, next_drafts=[1, 2, 3, 4]),
    }[case]
    with pytest.raises(StageFailed) as caught:
        check.take(*bad, "continues")
    assert caught.value.stage == 2 and caught.value.code == "BAD_REPLY"


PROMPT = [20, 21, 22]  # the toy's continuation of it changes token (most prompts repeat one)
N_DECODE = 14
PLACEMENTS = {"1": [(0, 12)], "3": [(0, 1), (1, 11), (11, 12)], "12": [(k, k + 1) for k in range(12)]}
THREE = PLACEMENTS["3"]


def _launch(stubs, tmp_path: Path, placement, *, mtp: bool = True, max_rewind: int = K, **faults: str):
    command = dataclasses.replace(fake_command(tmp_path), max_rewind=max_rewind, mtp=mtp)
    return launch(
        command,
        placement,
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=fake_env(stubs, **faults),
        call_deadline=20.0,
    )


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_a_drafting_ring_decodes_what_plain_greedy_decodes(stubs, tmp_path: Path, name: str) -> None:
    n = len(PLACEMENTS[name])
    with _launch(stubs, tmp_path, PLACEMENTS[name]) as p:
        plain = drive.run_placement(p.clients, [PROMPT], N_DECODE, all_logits=False).prompts[0]
        got, chained = (
            speculative.run(
                p.clients,
                PROMPT,
                N_DECODE,
                k=K,
                drafter=speculative.NextnDrafter(),
                route=routes.spec_named(f),
            )
            for f in ("ring", "chained")
        )
    assert got.tokens == plain.tokens == chained.tokens
    assert np.array_equal(got.logits, plain.logits), "the rows the ring chose from are plain decoding's"
    assert [q.fed for q in got.passes] == [q.fed for q in chained.passes]
    assert [q.accepted for q in got.passes] == [q.accepted for q in chained.passes]
    assert 0.0 < got.acceptance_rate < 1.0 and any(q.rewound for q in got.passes)
    assert all(q.step.forwarding == "ring" and q.step.crossings == n for q in got.passes)
    assert got.crossings_per_token == pytest.approx(n / got.tokens_per_pass)


def _inside_a_pass(
    route: ring.RingRoute, session: str, ref, budget: int, stop: tuple[int, ...]
) -> ring.RingRun:
    """A ring whose first pass verifies the true continuation across the toy's change of token
    (ref[7]), its drafts given by the driver: every one stands, so budget and stop cut inside it."""
    fed = [*PROMPT, *ref[:5]]
    route.run(
        session, 1, list(range(len(fed))), fed, boundary_dtype="f32", all_logits=False, keep_boundaries=False
    )
    return route.decode(
        session, 1, len(fed), ref[5], budget, stop_tokens=stop, draft=K, drafts=ref[6 : 6 + K]
    )


def test_budget_and_stop_tokens_end_a_drafting_ring_inside_a_pass(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, THREE) as p:
        ref = drive.run_placement(p.clients, [PROMPT], N_DECODE).prompts[0].tokens
        assert ref[6] != ref[7] == ref[8], "the toy's continuation changed"
        infos = drive.describe(p.clients)
        with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
            budgets = {
                b: ring.generate(route, PROMPT, b, session=f"b{b}", draft=K) for b in range(1, N_DECODE)
            }
            stops = {
                at: ring.generate(route, PROMPT, N_DECODE, stop_tokens=(ref[at],), session=f"s{at}", draft=K)
                for at in range(N_DECODE)
                if ref[at] not in ref[:at]
            }
            inside_budget = _inside_a_pass(route, "ib", ref, 2, ())
            inside_stop = _inside_a_pass(route, "is", ref, 20, (ref[7],))
            refused = route.sink.refused
    assert all(g.end == "budget" and g.tokens == ref[:b] for b, g in budgets.items())
    assert all(g.end == "stop_token" and g.tokens == ref[: at + 1] for at, g in stops.items())
    assert len(stops) == 2 and refused == 0
    assert inside_budget.end == "budget" and inside_budget.tokens == ref[6:8]
    assert inside_stop.end == "stop_token" and inside_stop.tokens == ref[6:8]
    for got in (inside_budget, inside_stop):
        assert len(got.drafted) == 1 and got.drafted[0].accepted == K and len(got.drafted[0].chosen) == 2


def test_a_drafting_ring_is_refused_where_it_cannot_run(stubs, tmp_path: Path) -> None:
    failed = {}
    for name, kw in {"no-mtp": {"mtp": False}, "rewind-1": {"max_rewind": 1}}.items():
        (tmp_path / name).mkdir()
        with _launch(stubs, tmp_path / name, THREE, **kw) as p:
            infos = drive.describe(p.clients)
            with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
                route.run(
                    "s", 1, [0, 1, 2], PROMPT, boundary_dtype="f32", all_logits=False, keep_boundaries=False
                )
                with pytest.raises(StageFailed) as caught:
                    route.decode("s", 1, 3, 5, 8, draft=K)
                failed[name] = caught.value
                with pytest.raises(ConfigurationError, match="drafts for the first pass"):
                    route.decode("s", 1, 3, 5, 8, draft=1, drafts=[5, 5])
    assert failed["no-mtp"].stage == 2 and failed["no-mtp"].code == "FAILED_PRECONDITION"
    assert "--mtp" in failed["no-mtp"].detail
    assert failed["rewind-1"].stage == 0 and "--max-rewind 3" in failed["rewind-1"].detail


def test_a_stage_killed_in_a_drafting_ring_is_named(stubs, tmp_path: Path) -> None:
    faults = {"DGR_FAKE_FAULT": "die-after-forwards:6", "DGR_FAKE_FAULT_BEGIN": "1"}
    with _launch(stubs, tmp_path, THREE, **faults) as p:
        started = time.perf_counter()
        with pytest.raises(StageFailed) as caught:
            speculative.run(
                p.clients, PROMPT, 40, k=K, drafter=speculative.NextnDrafter(), route=routes.Ring()
            )
        elapsed = time.perf_counter() - started
    assert caught.value.stage == 1 and caught.value.code == "DIED", caught.value
    assert elapsed < 10.0, elapsed  # the call deadline is 20 s: the death was seen, not waited out
