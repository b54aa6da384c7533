"""The real worker's pass port under --tls (issue 43), the CPU lane and the embedded tiny model.

- a client without a certificate, with one of another CA, with an expired one, and plain TCP are
  closed in the handshake: the pass they send never reaches the stage, while the same pass from a
  client of the worker's CA does (the stage logs that it dropped it: not a streamed ring's pass);
- a recorded TLS connection replayed byte for byte onto the pass port is closed the same way;
- 1,000 connections opened to a stage's pass port leave its thread count bounded (at most
  --max-pass-connections readers) and the streamed ring through it still equal to the relayed run.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline import drive, routes
from tests.tls_helpers import trusting_client, untrusted_clients
from worker import tls, tls_ca
from worker.launcher import Pipeline, WorkerCommand, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

N_LAYER = 12
TEXT = "The quick brown fox jumps over the lazy dog."
REACHED = "dropped a message that is not a streamed ring's pass"  # the stage's word for a pass it read
FLOOD = 1000


@pytest.fixture(scope="module")
def staged(
    worker_command: WorkerCommand, ca: Path, stubs, worker_env, tmp_path_factory
) -> Iterator[Pipeline]:
    driver = tls.load(ca / tls_ca.HOSTS / "driver")
    cmd = dataclasses.replace(worker_command, tls=ca / tls_ca.HOSTS / "worker", driver_tls=driver)
    evidence = tmp_path_factory.mktemp("staged")
    with launch(cmd, [(0, 6), (6, 12)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        yield p


def _pass_frame(stubs) -> bytes:
    """A framed ForwardRequest the stage reads and drops (no Ring.stream): proof it got through."""
    body = stubs.pb2.ForwardRequest(
        session_id="probe", epoch=1, positions=[0], tokens=[1]
    ).SerializeToString()
    return len(body).to_bytes(4, "little") + body


def _reached(p: Pipeline) -> int:
    return p.stages[1].stderr_path.read_text(errors="replace").count(REACHED)


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _send_over_tls(port: int, context: ssl.SSLContext, data: bytes) -> None:
    """Handshake, send, and read until the worker closes or 2 s pass (an error is the refusal)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(data)
                s.settimeout(2)
                s.recv(1)
    except (OSError, ssl.SSLError):
        pass


def test_a_pass_port_lets_through_only_clients_of_its_ca(
    staged: Pipeline, ca: Path, stubs, tmp_path: Path
) -> None:
    port = staged.clients[1].info().pass_port
    frame = _pass_frame(stubs)
    hostile = untrusted_clients(ca, tmp_path)
    before = _reached(staged)
    for what, context in hostile.items():
        _send_over_tls(port, context, frame)
        assert _reached(staged) == before, what
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:  # plaintext onto the TLS port
        plain.sendall(frame)
        plain.settimeout(15)
        try:
            while plain.recv(1 << 16):
                pass  # a TLS alert, then the worker closes
        except OSError:
            pass
    time.sleep(0.5)
    assert _reached(staged) == before
    log = staged.stages[1].stderr_path.read_text(errors="replace")
    assert log.count("pass port: closed a connection: TLS handshake") >= len(hostile) + 1
    _send_over_tls(port, trusting_client(ca, tls.load(ca / tls_ca.HOSTS / "driver")), frame)
    assert _wait_for(lambda: _reached(staged) == before + 1), (
        "the trusted client's pass never reached the stage"
    )


def test_a_recorded_connection_replayed_is_refused(staged: Pipeline, ca: Path, stubs) -> None:
    port = staged.clients[1].info().pass_port
    recorded = bytearray()
    with socket.create_server(("127.0.0.1", 0)) as proxy:
        relay = threading.Thread(target=_record_one, args=(proxy, port, recorded), daemon=True)
        relay.start()
        before = _reached(staged)
        driver = trusting_client(ca, tls.load(ca / tls_ca.HOSTS / "driver"))
        _send_over_tls(proxy.getsockname()[1], driver, _pass_frame(stubs))
        relay.join(30)
    assert _wait_for(lambda: _reached(staged) == before + 1) and len(recorded) > 100
    with socket.create_connection(("127.0.0.1", port), timeout=10) as replay:
        replay.sendall(bytes(recorded))
        replay.settimeout(15)
        try:
            while replay.recv(1 << 16):
                pass  # the worker's handshake answers, then it closes on the replayed Finished
        except OSError:
            pass
    time.sleep(0.5)
    assert _reached(staged) == before + 1, "a replayed connection's pass reached the stage"


def _record_one(proxy: socket.socket, port: int, recorded: bytearray) -> None:
    """Relay one connection to the pass port, keeping every byte the client sent."""
    client, _ = proxy.accept()
    with client, socket.create_connection(("127.0.0.1", port)) as server:
        back = threading.Thread(target=_pipe, args=(server, client, None), daemon=True)
        back.start()
        _pipe(client, server, recorded)
        back.join(10)


def _pipe(src: socket.socket, dst: socket.socket, keep: bytearray | None) -> None:
    try:
        while chunk := src.recv(1 << 16):
            if keep is not None:
                keep.extend(chunk)
            dst.sendall(chunk)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Threads:")))


def _sample_threads(pid: int, flooding: threading.Event, counts: list[int]) -> None:
    while flooding.is_set():
        counts.append(_threads(pid))
        time.sleep(0.002)


def test_a_thousand_connections_leave_the_ring_serving(staged: Pipeline) -> None:
    prompt = staged.clients[0].tokenize(TEXT, add_special=True)
    relayed = drive.run_placement(staged.clients, [prompt], 8)
    port = staged.clients[1].info().pass_port
    pid = staged.stages[1].pid
    before = _threads(pid)
    flood: list[socket.socket] = []
    counts: list[int] = []
    flooding = threading.Event()
    flooding.set()
    sampler = threading.Thread(target=_sample_threads, args=(pid, flooding, counts), daemon=True)
    sampler.start()
    try:
        for _ in range(FLOOD):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                pass  # a full accept queue: the kernel's refusal, before the worker sees it
        flooding.clear()
        sampler.join(10)
        assert len(flood) >= FLOOD // 2, f"only {len(flood)} of {FLOOD} connections opened"
        peak = max(counts + [_threads(pid)])  # the most at any moment of the flood, not only its end
        assert peak <= before + 16 + 4, (before, peak)  # --max-pass-connections (16) readers at most
        ring = drive.run_placement(staged.clients, [prompt], 8, route=routes.Ring())
        assert ring.prompts[0].tokens == relayed.prompts[0].tokens
        assert np.array_equal(ring.prompts[0].logits, relayed.prompts[0].logits)
    finally:
        for s in flood:
            s.close()
    print(f"\n{len(flood)} connections to the pass port: worker threads {before}, at most {peak} during it")
