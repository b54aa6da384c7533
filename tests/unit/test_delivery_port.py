"""The driver's delivery port (pipeline/delivery_port.py) over real loopback sockets, speaking as a
last stage does (worker/src/delivery_streams.cpp): every framed Delivery reaches ``take`` in order with
its arrival time, a refused one is answered with a framed DeliveryRefused on the same connection, a
frame over the limit or one that does not parse closes only its own connection, and stop() ends every
thread and connection."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from core.errors import ConfigurationError
from pipeline.delivery_port import DeliveryPort, read_exact
from pipeline.socket_io import HEAD_BYTES, frame
from tests.unit.fake_stages import load_stubs


@pytest.fixture(scope="module")
def pb2(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs")).pb2


class Taker:
    """Takes deliveries of the rings in ``reading``; refuses the rest."""

    def __init__(self, reading: set[str]) -> None:
        self.reading = reading
        self.taken: list[tuple[str, int, float]] = []
        self.arrived = threading.Event()

    def __call__(self, delivery: object, received_at: float) -> str | None:
        self.arrived.set()
        if delivery.request_id not in self.reading:
            return f"no ring {delivery.request_id!r} is read"
        self.taken.append((delivery.request_id, delivery.ring.index, received_at))
        return None


def _delivery(pb2, ring_id: str, index: int) -> bytes:
    return pb2.Delivery(request_id=ring_id, ring=pb2.RingToken(token=7, index=index)).SerializeToString()


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.settimeout(10)
    return conn


def _refusal(pb2, conn: socket.socket) -> object:
    head = read_exact(conn, HEAD_BYTES)
    assert head is not None, "the port closed instead of refusing"
    body = read_exact(conn, int.from_bytes(head, "little"))
    return pb2.DeliveryRefused.FromString(body)


def _wait(predicate, limit_s: float = 10.0) -> bool:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > limit_s:
            return False
        time.sleep(0.01)
    return True


def test_deliveries_reach_take_in_order_and_a_refusal_comes_back(pb2) -> None:
    taker = Taker({"read"})
    port = DeliveryPort(pb2, taker, host="127.0.0.1")
    address = port.start()
    try:
        with _connect(address) as conn:
            before = time.perf_counter()
            conn.sendall(b"".join(frame(_delivery(pb2, "read", i)) for i in range(3)))
            conn.sendall(frame(_delivery(pb2, "gone", 0)))
            refused = _refusal(pb2, conn)
        assert _wait(lambda: port.frames == 4)
    finally:
        port.stop()
    assert [(rid, index) for rid, index, _ in taker.taken] == [("read", 0), ("read", 1), ("read", 2)]
    assert all(at >= before for _, _, at in taker.taken)
    assert refused.request_id == "gone" and "no ring 'gone' is read" in refused.reason


@pytest.mark.parametrize("bad", ["oversized", "not-a-delivery"])
def test_a_bad_frame_closes_only_its_own_connection(pb2, bad) -> None:
    taker = Taker({"read"})
    port = DeliveryPort(pb2, taker, host="127.0.0.1", max_bytes=1024)
    address = port.start()
    try:
        with _connect(address) as good, _connect(address) as broken:
            if bad == "oversized":
                broken.sendall((4096).to_bytes(HEAD_BYTES, "little"))
            else:
                broken.sendall(frame(b"\xff\xff\xff"))  # no protobuf message parses from this
            assert broken.recv(1) == b"", "the port kept a connection that sent a bad frame"
            good.sendall(frame(_delivery(pb2, "read", 0)))
            assert _wait(lambda: len(taker.taken) == 1)
    finally:
        port.stop()
    assert taker.taken[0][:2] == ("read", 0)


def test_stop_ends_every_connection_and_thread(pb2) -> None:
    port = DeliveryPort(pb2, Taker(set()), host="127.0.0.1")
    address = port.start()
    conns = [_connect(address) for _ in range(3)]
    try:
        assert _wait(
            lambda: sum(t.name == "dgr-delivery-read" and t.is_alive() for t in threading.enumerate()) >= 3
        )
        port.stop()
        for conn in conns:
            assert conn.recv(1) == b"", "a connection outlived stop()"
    finally:
        for conn in conns:
            conn.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("dgr-delivery")]
    with pytest.raises(OSError):
        _connect(address)


def test_a_host_it_cannot_bind_is_a_configuration_error(pb2) -> None:
    with pytest.raises(ConfigurationError, match="delivery port cannot listen on 192.0.2.1"):
        DeliveryPort(pb2, Taker(set()), host="192.0.2.1").start()
