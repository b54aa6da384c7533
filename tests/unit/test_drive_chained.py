"""Chained forwarding (pipeline/drive.py + pipeline/sink.py) over real loopback fake workers.

The fake worker (fake_shard_worker.py) forwards the same way the C++ worker does, so these cover the
driver's side without a build: identical logits to relayed, crossings, hop timings, errors naming the
failing stage, a killed stage seen as DIED, and nothing left running.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from core.errors import ConfigurationError
from pipeline import drive, routes
from pipeline.sink import Sink, chain_route
from tests.unit.fake_stages import TOY, fake_command, fake_env, load_stubs, running
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
def test_chained_equals_relayed_bitwise(stubs, tmp_path: Path, name: str) -> None:
    placement = PLACEMENTS[name]
    n = len(placement)
    with _launch(stubs, tmp_path, placement) as p:
        relayed = drive.run_placement(p.clients, PROMPTS, N_DECODE)
        chained = drive.run_placement(p.clients, PROMPTS, N_DECODE, route=routes.Chained())
        for c in p.clients:
            assert c.health()[1] == "ok"
    assert (relayed.forwarding, chained.forwarding) == ("relayed", "chained")
    for r, c in zip(relayed.prompts, chained.prompts, strict=True):
        assert np.array_equal(r.logits, c.logits) and r.tokens == c.tokens
        assert r.logit_positions == c.logit_positions
        for cut in chained.cuts:
            assert np.array_equal(r.boundaries[cut], c.boundaries[cut]), cut
        for step in (c.prefill, *c.decode):
            assert step.forwarding == "chained" and step.crossings == n + 1
            assert len(step.seam_seconds) == n - 1 and all(s >= 0 for s in step.seam_seconds)
            assert len(step.stage_compute) == n
            assert all(0 <= x <= step.wall_seconds for x in step.stage_compute)
            assert all(w >= x for w, x in zip(step.stage_wall, step.stage_compute, strict=True))
        for step in (r.prefill, *r.decode):
            assert step.forwarding == "relayed" and step.crossings == 2 * n
    assert chained.seam_bytes() == relayed.seam_bytes()


def test_chained_f16_seams_match_relayed_f16(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["3"]) as p:
        relayed = drive.run_placement(p.clients, PROMPTS, N_DECODE, boundary_dtype="f16")
        chained = drive.run_placement(
            p.clients, PROMPTS, N_DECODE, boundary_dtype="f16", route=routes.Chained()
        )
    rows = sum(len(x) + N_DECODE - 1 for x in PROMPTS)
    assert chained.seam_bytes() == relayed.seam_bytes() == (rows * TOY["n_embd"] * 2,) * 2
    for r, c in zip(relayed.prompts, chained.prompts, strict=True):
        assert np.array_equal(r.logits, c.logits) and r.tokens == c.tokens


def test_chained_prefill_in_n_batch_chunks(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["2"], DGR_FAKE_N_BATCH="3") as p:
        relayed = drive.run_placement(p.clients, PROMPTS, N_DECODE)
        chained = drive.run_placement(p.clients, PROMPTS, N_DECODE, route=routes.Chained())
    for r, c in zip(relayed.prompts, chained.prompts, strict=True):
        assert np.array_equal(r.logits, c.logits) and r.tokens == c.tokens
    long = chained.prompts[2].prefill
    assert long.n_tokens == 10 and long.crossings == 4 * 3  # four chunks of at most 3 positions


def test_speed_chained(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["3"]) as p:
        speed = drive.measure_speed(p.clients, PROMPTS[0], 6, repetitions=2, warmup=1, route=routes.Chained())
        relayed = drive.measure_speed(p.clients, PROMPTS[0], 6, repetitions=2, warmup=1)
    assert speed.forwarding == "chained" and speed.crossings_per_token == 4
    assert relayed.forwarding == "relayed" and relayed.crossings_per_token == 6
    assert speed.seam_bytes_per_token == relayed.seam_bytes_per_token == (TOY["n_embd"] * 4,) * 2
    assert all(v > 0 for v in speed.decode_tok_s) and len(speed.seam_seconds[0]) == 2


def test_capture_and_unknown_forwarding_are_refused(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["2"]) as p:
        with pytest.raises(ConfigurationError, match="relayed passes"):
            drive.run_placement(p.clients, PROMPTS, 2, capture=[3], route=routes.Chained())
        with pytest.raises(ConfigurationError, match="forwarding 'teleported'"):
            drive.run_placement(p.clients, PROMPTS, 2, route=routes.spec_named("teleported"))
        with pytest.raises(ConfigurationError, match="1 stage addresses for 2 stages"):
            drive.run_placement(
                p.clients, PROMPTS, 2, route=routes.Chained(), reach=routes.Reach(addresses=("127.0.0.1:1",))
            )


def test_wrong_position_in_the_chain_is_refused(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["2"]) as p, Sink(stubs.pb2, stubs.pb2_grpc) as sink:
        first, last = p.clients
        ack = first.forward_chained(
            "s", 1, [0], tokens=[1], downstream=[], deliver_to=sink.address, request_id="x"
        )
        with pytest.raises(grpc.RpcError) as caught:
            ack.result()
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not the last but no downstream" in caught.value.details()
        refused = "INVALID_ARGUMENT: Forward: downstream addresses without deliver_to"
        with pytest.raises(StageFailed, match=refused):
            last._call(
                "Forward", stubs.pb2.ForwardRequest(session_id="s", positions=[0], downstream=["x:1"]), None
            )


def test_mid_chain_error_names_that_stage(stubs, tmp_path: Path) -> None:
    with _launch(
        stubs,
        tmp_path,
        [(0, 3), (3, 6), (6, 9), (9, 12)],
        DGR_FAKE_FAULT="fail-after-forwards:2",
        DGR_FAKE_FAULT_BEGIN="6",
    ) as p:
        with pytest.raises(StageFailed) as caught:
            drive.run_placement(p.clients, PROMPTS, N_DECODE, route=routes.Chained())
        addr = p.clients[2].address
        assert all(running(pid) for pid in p.pids)
    err = caught.value
    # stage 1 names the hop it called; stage 0 passes that on unchanged (one prefix, not two)
    assert (err.stage, err.layers, err.code) == (2, (6, 9), "INTERNAL")
    assert err.detail == f"chained Forward: stage 2 at {addr}: injected failure in Forward 3"
    assert not any(running(pid) for pid in p.pids)


def test_wrong_address_order_is_refused_by_the_stage_it_reaches(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, [(0, 3), (3, 6), (6, 9), (9, 12)]) as p:
        addrs = [c.address for c in p.clients]
        with pytest.raises(StageFailed) as caught:
            drive.run_placement(
                p.clients,
                PROMPTS[:1],
                3,
                route=routes.Chained(),
                reach=routes.Reach(addresses=(addrs[0], addrs[1], addrs[3], addrs[2])),
            )
    # stage 1 hands its boundary to the worker at addrs[3] (layers 9:12): that is the last stage and
    # it is given a downstream address, which it refuses; the driver names the hop as stage 2
    err = caught.value
    assert (err.stage, err.code) == (2, "INVALID_ARGUMENT")
    assert f"stage 2 at {addrs[3]}" in err.detail and "last stage" in err.detail


def test_killed_mid_chain_stage_is_seen_as_died(stubs, tmp_path: Path) -> None:
    with _launch(
        stubs,
        tmp_path,
        [(0, 4), (4, 8), (8, 12)],
        DGR_FAKE_FAULT="die-after-forwards:3",
        DGR_FAKE_FAULT_BEGIN="4",
    ) as p:
        started = time.monotonic()
        died = r"stage 1 \(layers 4:8\) failed: DIED: worker was killed by SIGKILL"
        with pytest.raises(StageFailed, match=died):
            drive.run_placement(p.clients, PROMPTS, N_DECODE, route=routes.Chained())
        assert time.monotonic() - started < 10
        pids = p.pids
    assert not any(running(pid) for pid in pids)


def test_stage_dead_before_the_pass_is_named(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, PLACEMENTS["3"]) as p:
        infos = drive.describe(p.clients)
        p.stages[2].process.kill()
        p.stages[2].process.wait()
        died = r"stage 2 \(layers 11:12\) failed: DIED: worker was killed by SIGKILL"
        with pytest.raises(StageFailed, match=died):
            with chain_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route:
                route.run("s", 1, [0], [1], boundary_dtype="f32", all_logits=False, keep_boundaries=False)


def test_hung_stage_ends_at_the_deadline(stubs, tmp_path: Path) -> None:
    with launch(
        fake_command(tmp_path),
        PLACEMENTS["3"],
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=fake_env(stubs, DGR_FAKE_FAULT="hang-forward", DGR_FAKE_FAULT_BEGIN="1"),
        call_deadline=1.5,
        grace=1.0,
    ) as p:
        infos = drive.describe(p.clients)
        started = time.monotonic()
        # the route directly: run_placement would go on to Reset the session, which the hung stage's
        # fake holds its lock against for drive.UNWIND_RESET_S (test_drive_unwind.py)
        with (
            pytest.raises(StageFailed, match="DEADLINE_EXCEEDED") as caught,
            chain_route(p.clients, infos, addresses=None, sink_host="127.0.0.1") as route,
        ):
            route.run("s", 1, [0], [1], boundary_dtype="f32", all_logits=False, keep_boundaries=False)
        assert time.monotonic() - started < 5
    assert caught.value.code == "DEADLINE_EXCEEDED" and "1.5 s" in caught.value.detail
    assert not any(running(pid) for pid in p.pids)


def test_sink_refuses_unknown_deliveries(stubs) -> None:
    with Sink(stubs.pb2, stubs.pb2_grpc) as sink:
        channel = grpc.insecure_channel(sink.address)
        stub = stubs.pb2_grpc.PipelineSinkStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Deliver(stubs.pb2.Delivery(request_id="nobody"), timeout=5)
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        waiting = sink.expect("a")
        stub.Deliver(stubs.pb2.Delivery(request_id="a"), timeout=5)
        assert waiting.result(timeout=5).delivery.request_id == "a"
        with pytest.raises(grpc.RpcError):
            stub.Deliver(stubs.pb2.Delivery(request_id="a"), timeout=5)  # answered once only
        sink.expect("b")
        sink.forget("b")
        with pytest.raises(grpc.RpcError):
            stub.Deliver(stubs.pb2.Delivery(request_id="b"), timeout=5)
        assert (sink.refused, sink.delivered) == (3, 1)
        channel.close()
    with pytest.raises(ConfigurationError, match="cannot listen"):
        Sink(stubs.pb2, stubs.pb2_grpc, host="192.0.2.1").start()
