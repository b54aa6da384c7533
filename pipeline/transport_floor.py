"""The transport floor a seam is read against: loopback round trips of a boundary's size, no model.

A seam's measured cost means little alone: 0.5 ms per crossing is slow for a 1 KiB boundary on
loopback and fast for a WAN link.  This measures, on the machine that certifies and in the same run,
what one crossing of the same bytes costs with nothing behind it:

- ``tcp``: a bare TCP round trip over loopback (TCP_NODELAY, a thread echoing the bytes back): a
  syscall pair and a copy each way, the physical floor for a process on this box;
- ``grpc``: a unary gRPC call of the same bytes to an in-process echo server with the channel options
  the driver uses: the transport a Forward rides on, without the model.

Round trips are what is timed (one clock, no skew); a one-way crossing is half of one.  Both figures
are medians with their quartiles: on a loaded machine the spread says how far to trust them.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from worker.client import CHANNEL_OPTIONS

ECHO_SERVICE = "dgr.floor.Floor"
ECHO = f"/{ECHO_SERVICE}/Echo"


def _recv_exact(sock: socket.socket, n: int, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            raise ConnectionError("peer closed")
        got += k


def timed(one: Callable[[], object], round_trips: int, warmup: int) -> np.ndarray:
    """Seconds per call of ``one``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        one()
    times = np.empty(round_trips)
    for i in range(round_trips):
        t0 = time.perf_counter()
        one()
        times[i] = time.perf_counter() - t0
    return times


def tcp_round_trips(size: int, round_trips: int, warmup: int) -> np.ndarray:
    """Seconds per loopback TCP round trip of ``size`` bytes (an echo thread on the other end)."""
    server = socket.create_server(("127.0.0.1", 0))
    buf = bytearray(size)

    def serve() -> None:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            for _ in range(warmup + round_trips):
                _recv_exact(conn, size, buf)
                conn.sendall(buf)

    echo = threading.Thread(target=serve, daemon=True, name="dgr-floor-echo")
    echo.start()
    payload, back = os.urandom(size), bytearray(size)
    try:
        with socket.create_connection(server.getsockname()[:2]) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            times = timed(lambda: (sock.sendall(payload), _recv_exact(sock, size, back)), round_trips, warmup)
        echo.join(timeout=10)
    finally:
        server.close()
    if bytes(back) != payload:
        raise RuntimeError("the TCP echo did not return the bytes sent: it measured nothing")
    return times


def grpc_round_trips(size: int, round_trips: int, warmup: int) -> np.ndarray:
    """Seconds per unary gRPC echo of ``size`` bytes on loopback (in-process server, no model)."""

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(ECHO)
            payload = os.urandom(size)
            times = timed(lambda: call(payload, timeout=10), round_trips, warmup)
            if call(payload, timeout=10) != payload:
                raise RuntimeError("the gRPC echo did not return the bytes sent: it measured nothing")
            return times
    finally:
        server.stop(grace=None)


def quartiles(times: np.ndarray) -> dict[str, float]:
    q1, median, q3 = (float(x) for x in np.percentile(times, [25, 50, 75]))
    return {"median": median, "q1": q1, "q3": q3}


def measure(sizes: Iterable[int], *, round_trips: int = 300, warmup: int = 50) -> dict[str, Any]:
    """Both floors for each distinct boundary size, with the load average they were taken under."""
    rows = []
    for size in sorted({int(s) for s in sizes if int(s) > 0}):
        tcp = tcp_round_trips(size, round_trips, warmup)
        rpc = grpc_round_trips(size, round_trips, warmup)
        rows.append({"bytes": size, "tcp_round_trip_s": quartiles(tcp), "grpc_round_trip_s": quartiles(rpc)})
    return {"round_trips": round_trips, "load_average": os.getloadavg()[0], "sizes": rows}


def one_way_floor_s(floor: dict[str, Any] | None, size: int, transport: str = "grpc") -> float | None:
    """Half the median round trip of the floor row for ``size`` bytes (None when it was not measured)."""
    for row in (floor or {}).get("sizes", []):
        if row["bytes"] == size:
            return row[f"{transport}_round_trip_s"]["median"] / 2
    return None
