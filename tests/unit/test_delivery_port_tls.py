"""The driver's delivery port with a TLS identity (issue 43), over real loopback sockets: a last stage
presenting a certificate of the driver's CA delivers as before, and one without a certificate, with
one of another CA, with an expired one, or plain TCP, is closed in the handshake with nothing taken;
stop() ends a connection still in its handshake."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from pipeline.delivery_port import DeliveryPort
from pipeline.socket_io import frame
from tests.tls_helpers import trusting_client, untrusted_clients
from tests.unit.fake_stages import load_stubs
from worker import tls, tls_ca


@pytest.fixture(scope="module")
def pb2(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs")).pb2


def _deliver(address: str, context: ssl.SSLContext | None, body: bytes) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            conn = raw if context is None else context.wrap_socket(raw, server_hostname=host)
            with conn:
                conn.sendall(frame(body))
                conn.settimeout(1)
                conn.recv(1)
    except (OSError, ssl.SSLError):
        pass


def test_only_a_last_stage_of_the_drivers_ca_delivers(pb2, ca: Path, tmp_path: Path) -> None:
    taken: list[str] = []
    port = DeliveryPort(
        pb2,
        lambda d, at: taken.append(d.request_id),
        host="127.0.0.1",
        tls=tls.load(ca / tls_ca.HOSTS / "driver"),
    )
    address = port.start()
    try:
        hostile = {"plain TCP": None, **untrusted_clients(ca, tmp_path, name="worker")}
        for what, context in hostile.items():
            _deliver(address, context, pb2.Delivery(request_id=what).SerializeToString())
        time.sleep(0.3)
        assert taken == [] and port.frames == 0
        _deliver(
            address,
            trusting_client(ca, tls.load(ca / tls_ca.HOSTS / "worker")),
            pb2.Delivery(request_id="ok").SerializeToString(),
        )
        until = time.monotonic() + 10
        while not taken and time.monotonic() < until:
            time.sleep(0.05)
        assert taken == ["ok"] and port.frames == 1
    finally:
        port.stop()


def test_stop_ends_a_connection_still_in_its_handshake(pb2, ca: Path) -> None:
    port = DeliveryPort(pb2, lambda d, at: None, host="127.0.0.1", tls=tls.load(ca / tls_ca.HOSTS / "driver"))
    host, _, p = port.start().rpartition(":")
    silent = socket.create_connection((host, int(p)), timeout=10)  # connects, never says a word
    time.sleep(0.3)
    started = time.monotonic()
    port.stop()
    assert time.monotonic() - started < 5, "stop() waited on a handshake"
    assert not [t for t in threading.enumerate() if t.name.startswith("dgr-delivery") and t.is_alive()]
    silent.close()
