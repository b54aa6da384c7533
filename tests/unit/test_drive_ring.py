"""Ring decode's driver side (pipeline/ring.py, drive route=routes.Ring()) over real loopback fake workers.

The fake worker (fake_shard_worker.py) runs rings with the C++ worker's messages, so these cover the
driver without a build: ring == relayed bitwise, the budget and stop tokens, a token that is not its
logits' argmax refused, a failed or killed stage named, nothing left running.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigurationError
from pipeline import drive, ring, routes, yielding
from tests.unit.fake_stages import fake_command, fake_env, load_stubs
from worker.client import StageFailed
from worker.launcher import launch

PROMPTS = [[1, 5, 9, 2], [7], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
N_DECODE = 6
PLACEMENTS = {
    "1": [(0, 12)],
    "2": [(0, 6), (6, 12)],
    "3": [(0, 1), (1, 11), (11, 12)],
    "12": [(k, k + 1) for k in range(12)],
}
THREE = PLACEMENTS["3"]
VARIED = [20, 21, 22]  # the toy's continuation changes token inside 12 steps (most repeat one)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


def _launch(stubs, tmp_path: Path, placement, **faults: str):
    return launch(
        fake_command(tmp_path),
        placement,
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=fake_env(stubs, **faults),
        call_deadline=20.0,
    )


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_ring_equals_relayed_bitwise(stubs, tmp_path: Path, name: str) -> None:
    n = len(PLACEMENTS[name])
    with _launch(stubs, tmp_path, PLACEMENTS[name]) as p:
        relayed = drive.run_placement(p.clients, PROMPTS, N_DECODE)
        ringed = drive.run_placement(p.clients, PROMPTS, N_DECODE, route=routes.Ring())
        speed = drive.measure_speed(p.clients, PROMPTS[0], 6, repetitions=2, warmup=1, route=routes.Ring())
    assert ringed.forwarding == "ring" and speed.crossings_per_token == n
    for r, g in zip(relayed.prompts, ringed.prompts, strict=True):
        assert np.array_equal(r.logits, g.logits) and r.tokens == g.tokens
        assert r.logit_positions == g.logit_positions
        for cut in ringed.cuts:
            assert np.array_equal(r.boundaries[cut], g.boundaries[cut]), cut
        assert all(s.forwarding == "ring" and s.crossings == n and s.wall_seconds > 0 for s in g.decode)
    assert all(v > 0 for v in speed.decode_tok_s)


def test_budget_and_stop_tokens(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, THREE) as p:
        ref = drive.run_placement(p.clients, [VARIED], 12).prompts[0]
        at = next(i for i in range(1, 12) if ref.tokens[i] not in ref.tokens[:i])  # 7 on the toy
        infos = drive.describe(p.clients)
        with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as r:
            budget = ring.generate(r, VARIED, 5, session="b")
            stopped = ring.generate(r, VARIED, 12, stop_tokens=(ref.tokens[at],), session="s")
            refused, framed, came = r.sink.refused, r.sink.frames, r.sink.deliveries_came_as()
    assert budget.end == "budget" and budget.tokens == ref.tokens[:5] and budget.logits.shape[0] == 5
    assert stopped.end == "stop_token" and stopped.tokens == ref.tokens[: at + 1]
    assert refused == 0
    # a worker that ignores Ring.delivery_stream (the fake, as one that predates it) calls Deliver
    assert framed == 0 and came == "Deliver calls"


def test_a_token_that_is_not_the_argmax_is_refused(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, THREE, DGR_FAKE_FAULT="wrong-token", DGR_FAKE_FAULT_BEGIN="11") as p:
        with pytest.raises(StageFailed) as caught:
            drive.run_placement(p.clients, PROMPTS[:1], N_DECODE, route=routes.Ring())
    assert caught.value.stage == 2 and caught.value.code == "BAD_REPLY" and "argmax" in caught.value.detail


@pytest.mark.parametrize(
    "fault, code", [("fail-after-forwards:3", "INTERNAL"), ("die-after-forwards:3", "DIED")]
)
def test_a_failing_middle_stage_is_named(stubs, tmp_path: Path, fault: str, code: str) -> None:
    with _launch(stubs, tmp_path, THREE, DGR_FAKE_FAULT=fault, DGR_FAKE_FAULT_BEGIN="1") as p:
        with pytest.raises(StageFailed) as caught:
            drive.run_placement(p.clients, PROMPTS[:1], 20, route=routes.Ring())
    assert caught.value.stage == 1 and caught.value.code == code, caught.value
    assert "ring Forward" in str(caught.value)


def test_teacher_forcing_and_captures_refuse_a_ring(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["2"]) as p:
        with pytest.raises(ConfigurationError, match="teacher forcing"):
            drive.run_placement(p.clients, PROMPTS[:1], 3, route=routes.Ring(), forced=[[1, 2, 3]])
        with pytest.raises(ConfigurationError, match="relayed"):
            drive.run_placement(p.clients, PROMPTS[:1], 3, route=routes.Ring(), capture=[3])


def test_a_token_only_ring_chooses_the_same_tokens_and_delivers_no_logits(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, THREE) as p:
        ref = drive.run_placement(p.clients, [VARIED], 12, route=routes.Ring()).prompts[0]
        infos = drive.describe(p.clients)
        with ring.ring_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as r:
            bare = ring.generate(r, VARIED, 12, session="bare", logits=False)
            with pytest.raises(ConfigurationError, match="drafting ring needs its logits"):
                r.decode("draft", 1, 0, VARIED[0], 3, draft=2, logits=False)
        speed = drive.measure_speed(
            p.clients, VARIED, 12, repetitions=2, warmup=1, route=routes.Ring(logits=False)
        )
    assert bare.tokens == tuple(ref.tokens) and bare.end == "budget"
    assert bare.logits.shape == (1, ref.logits.shape[1])  # the prefill's row, picked by the driver
    assert bare.ring is not None and all(len(ps.logits) == 0 for ps in bare.ring.passes)
    assert all(v > 0 for v in speed.decode_tok_s) and speed.crossings_per_token == 3


def test_a_token_only_ring_that_delivers_logits_is_refused(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, THREE, DGR_FAKE_FAULT="logits-anyway", DGR_FAKE_FAULT_BEGIN="11") as p:
        with pytest.raises(StageFailed) as caught:
            drive.measure_speed(
                p.clients, VARIED, 8, repetitions=1, warmup=0, route=routes.Ring(logits=False)
            )
    assert caught.value.stage == 2 and caught.value.code == "BAD_REPLY"
    assert "token-only ring delivered logits" in caught.value.detail


def test_token_only_speed_runs_that_disagree_are_refused(stubs, tmp_path: Path) -> None:
    """A token-only ring cannot be held to its logits, so its repetitions are held to each other: a
    last stage that starts choosing other tokens part way (here after 20 passes) is caught."""
    with _launch(
        stubs, tmp_path, THREE, DGR_FAKE_FAULT="wrong-token-after-forwards:20", DGR_FAKE_FAULT_BEGIN="11"
    ) as p:
        with pytest.raises(StageFailed) as caught:
            drive.measure_speed(
                p.clients, VARIED, 12, repetitions=2, warmup=1, route=routes.Ring(logits=False)
            )
    assert caught.value.stage == 2 and caught.value.code == "BAD_REPLY"
    assert "different greedy continuations" in caught.value.detail


@pytest.mark.skipif(not yielding.supported(), reason="SCHED_BATCH is Linux's")
def test_the_driver_yields_to_the_stages_while_it_reads_a_ring(stubs, tmp_path: Path, monkeypatch) -> None:
    """Reading a ring, the driver's threads run SCHED_BATCH (a delivery's wake-up must not preempt a
    stage sharing the host); before and after, and with ``ring_driver_yields=False``, they do not."""
    read = ring.RingRoute._read
    seen: list[tuple[bool, int]] = []

    def recording(self, *args, **kwargs):
        seen.append((self.driver_yields, os.sched_getscheduler(0)))
        return read(self, *args, **kwargs)

    monkeypatch.setattr(ring.RingRoute, "_read", recording)
    with _launch(stubs, tmp_path, THREE) as p:
        for yields in (True, False):
            drive.measure_speed(
                p.clients, VARIED, 4, repetitions=1, warmup=0, route=routes.Ring(driver_yields=yields)
            )
            assert os.sched_getscheduler(0) == os.SCHED_OTHER
    assert seen == [(True, os.SCHED_BATCH), (False, os.SCHED_OTHER)]
