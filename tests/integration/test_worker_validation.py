"""Issue 20 items 11-12 on the real worker: a Forward is validated before it changes anything (a rejected
request neither wipes a live session's KV on a higher epoch nor holds a session slot); a chained call may
make a worker started with --peers dial only the addresses listed (PERMISSION_DENIED otherwise, before
any stage computes), a bad --peers is a usage error, and messages are capped at the model's bound."""

from __future__ import annotations

import dataclasses
import subprocess

import grpc
import numpy as np
import pytest

from pipeline import drive, routes
from tests.integration.conftest import our_workers
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TEXT = "A rejected request must not change the session it names."


def test_a_rejected_request_leaves_a_live_session_usable(worker_command, stubs, worker_env, tmp_path) -> None:
    with launch(
        worker_command,
        [(0, 6), (6, 12)],
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=worker_env,
        call_deadline=60,
    ) as p:
        first = p.clients[0]
        prompt = first.tokenize(TEXT, add_special=True)
        n = len(prompt)
        for session in ("live", "untouched"):
            first.forward(session, 1, list(range(n - 1)), tokens=prompt[:-1])
        # a higher epoch that does not start at 0 (twice): refused, and neither is a route change
        for positions in ([n + 3], [n - 3]):
            with pytest.raises(StageFailed, match="FAILED_PRECONDITION") as caught:
                first.forward("live", 2, positions, tokens=[1])
        print(f"\n[validation] higher epoch, out of order: {caught.value}")
        # the session goes on at epoch 1 where it was, with the KV it had: bitwise the untouched one
        live = first.forward("live", 1, [n - 1], tokens=prompt[-1:])
        same = first.forward("untouched", 1, [n - 1], tokens=prompt[-1:])
        assert live.boundary is not None and np.array_equal(live.boundary, same.boundary)
        for session in ("live", "untouched"):
            assert first.reset(session) is True


def test_a_rejected_new_session_holds_no_slot(worker_command, stubs, worker_env, tmp_path) -> None:
    one_slot = dataclasses.replace(worker_command, max_sessions=1)
    with launch(
        one_slot, [(0, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env, call_deadline=60
    ) as p:
        client = p.clients[0]
        for k in range(3):  # non-contiguous positions of a new session: refused each time
            with pytest.raises(StageFailed, match="FAILED_PRECONDITION.*not contiguous"):
                client.forward(f"bad-{k}", 1, [0, 2], tokens=[1, 1])
        assert client.health() == (True, "serving, 0 session(s)")
        prompt = client.tokenize(TEXT, add_special=True)
        client.forward("good", 1, list(range(len(prompt))), tokens=prompt)  # the one slot is still free
        assert client.reset("good") is True


def _chained(first, downstream, deliver_to):
    return first.forward_chained(
        "chained",
        1,
        [0],
        tokens=[1],
        downstream=downstream,
        deliver_to=deliver_to,
        request_id="r1",
        deadline=30,
    )


def test_an_address_not_in_peers_is_refused(worker_command, stubs, worker_env, tmp_path) -> None:
    listed = dataclasses.replace(worker_command, extra=("--peers", "127.0.0.1:*"))
    with launch(
        listed, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env, call_deadline=60
    ) as p:
        second = p.clients[1].address
        cases = {
            "downstream": (["10.255.255.1:7001"], "127.0.0.1:9"),
            "deliver_to": ([second], "10.255.255.1:7002"),
            "scheme": (["unix:/tmp/dgr-not-a-peer"], "127.0.0.1:9"),
        }
        for what, (downstream, sink) in cases.items():
            with pytest.raises(grpc.RpcError) as caught:
                _chained(p.clients[0], downstream, sink).result()
            err = caught.value
            print(f"\n[peers] {what}: {err.code().name}: {err.details()}")
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED, err.details()
            assert "is not in this worker's --peers (127.0.0.1:*)" in err.details()
            assert p.clients[0].reset("chained") is False  # refused before the stage computed
        # what is listed still chains: the placement's own loopback addresses and the driver's sink
        prompts = [p.clients[0].tokenize(TEXT, add_special=True)]
        chained = drive.run_placement(p.clients, prompts, 4, route=routes.Chained())
        relayed = drive.run_placement(p.clients, prompts, 4)
        assert chained.prompts[0].tokens == relayed.prompts[0].tokens
    assert our_workers(worker_command.program[0]) == []


BAD_PEERS = ["unix:/tmp/x", "dns:///h:1", "host", "h:0", "h:70000", "ipv4:1.2.3.4:5", "a:1,,b:2"]


@pytest.mark.parametrize("bad", BAD_PEERS)
def test_a_bad_peers_entry_is_a_usage_error(worker_command, bad) -> None:
    argv = worker_command.argv((0, 12)) + ["--peers", bad]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--peers: expected HOST:PORT or HOST:* entries" in done.stderr


def test_a_message_past_the_models_bound_is_refused(worker_command, stubs, worker_env, tmp_path) -> None:
    with launch(
        worker_command,
        [(0, 6), (6, 12)],
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=worker_env,
        call_deadline=60,
    ) as p:
        info = p.clients[1].info()
        # n_batch rows of logits plus a boundary row per layer and one more: 4 bytes each, +1 MiB of slack
        bound = info.n_batch * 4 * (info.n_vocab + (info.n_layer + 1) * info.boundary_width) + (2 << 20)
        rows = bound // (4 * info.boundary_width) + 1
        with pytest.raises(StageFailed, match="RESOURCE_EXHAUSTED") as caught:
            p.clients[1].forward(
                "big", 1, list(range(rows)), boundary=np.zeros((rows, info.boundary_width), np.float32)
            )
        size = rows * info.boundary_width * 4
        print(f"\n[limits] {rows} x {info.boundary_width} f32 ({size} bytes): {caught.value}")
        assert p.clients[1].health()[0]  # still serving
