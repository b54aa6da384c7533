"""The transport floor a seam is measured against (issue 19 item 3): one loopback round trip of a
boundary's size with no model, on this machine, in one run.

- tcp: a bare TCP round trip over loopback (TCP_NODELAY, a thread echoing the bytes back): a syscall
  pair and a copy each way, the physical floor for a Python driver on this box;
- grpc: a unary gRPC call of the same bytes to an in-process server (grpcio, the client options the
  driver uses): the transport the worker's Forward rides on, with no model behind it.

Sizes: 1 KiB (tiny-llama's boundary per decoded token: 256 f32) and 64 KiB (DeepSeek V4 Flash's
hyper-connection residual: 4 x 4096 f32).  Each figure is the median of many round trips, with the
interquartile range and the load average printed beside it; the ratio grpc/tcp says how far the
transport sits above the floor.  A seam's measured cost (test_bench_decode's ``seam_seconds_median``,
the certificate's per-seam figures) is to be read against these.

Run: ``nox -s bench`` (or ``pytest tests/bench -m slow -s -k floor``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
import numpy as np
import pytest

from worker.client import CHANNEL_OPTIONS

pytestmark = pytest.mark.slow

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10}
ROUND_TRIPS = 2000
WARMUP = 200
ECHO = "/dgr.bench.Floor/Echo"


def _recv_exact(sock: socket.socket, n: int, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            raise ConnectionError("peer closed")
        got += k


def _tcp_round_trips(size: int) -> np.ndarray:
    server = socket.create_server(("127.0.0.1", 0))
    buf = bytearray(size)

    def serve() -> None:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            for _ in range(WARMUP + ROUND_TRIPS):
                _recv_exact(conn, size, buf)
                conn.sendall(buf)

    echo = threading.Thread(target=serve, daemon=True)
    echo.start()
    payload, back = os.urandom(size), bytearray(size)
    with socket.create_connection(server.getsockname()[:2]) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = _timed(lambda: (sock.sendall(payload), _recv_exact(sock, size, back)))
    echo.join(timeout=10)
    server.close()
    assert bytes(back) == payload, "the echo did not return the bytes sent: the round trip measured nothing"
    return times


def _grpc_round_trips(size: int) -> np.ndarray:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "dgr.bench.Floor", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(ECHO)
            payload = os.urandom(size)
            times = _timed(lambda: call(payload, timeout=10))
            assert call(payload, timeout=10) == payload, "the echo did not return the bytes sent"
            return times
    finally:
        server.stop(grace=None)


def _timed(one: Callable[[], object]) -> np.ndarray:
    for _ in range(WARMUP):
        one()
    times = np.empty(ROUND_TRIPS)
    for i in range(ROUND_TRIPS):
        t0 = time.perf_counter()
        one()
        times[i] = time.perf_counter() - t0
    return times


def _describe(times: np.ndarray) -> str:
    q1, med, q3 = np.percentile(times, [25, 50, 75]) * 1e6
    return f"median {med:.1f} us (IQR {q1:.1f}-{q3:.1f})"


@pytest.mark.parametrize("label", list(SIZES))
def test_bench_transport_floor(benchmark, label: str) -> None:
    size = SIZES[label]
    tcp = _tcp_round_trips(size)
    rpc = _grpc_round_trips(size)
    ratio = float(np.median(rpc) / np.median(tcp))
    benchmark.extra_info.update(bytes=size, tcp_median_s=float(np.median(tcp)),
                                grpc_median_s=float(np.median(rpc)), grpc_over_tcp=ratio)
    benchmark.pedantic(lambda: None, rounds=1)  # the figures are the round trips above, not this call
    print(f"\n[bench] floor {label}: tcp {_describe(tcp)}; grpc unary {_describe(rpc)}; "
          f"grpc/tcp {ratio:.1f}x; load average {os.getloadavg()[0]:.2f}")
