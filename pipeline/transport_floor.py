"""The transport floor a seam is read against: loopback round trips of a boundary's size, no model.

A seam's measured cost means little alone: 0.5 ms per crossing is slow for a 1 KiB boundary on
loopback and fast for a WAN link.  This measures, on the machine that certifies and in the same run,
what one crossing of the same bytes costs with nothing behind it:

- ``tcp``: a bare TCP round trip over loopback (TCP_NODELAY, a thread echoing the bytes back): a
  syscall pair and a copy each way, the physical floor for a process on this box;
- ``tcp_one_core`` and ``tcp_two_cores``: the same round trip with the echo in another process, as a
  ring's pass port crosses from one worker process to the next, both ends held to one core, then each
  to its own (absent where this process may use one CPU only).  Whether the scheduler puts the two
  ends on one core or two decides the figure: waking a process on another core costs tens of
  microseconds on a virtual machine (measured on the 2-core box: about 3 us one way on one core, 25-40
  us across two), and ``tcp`` lands on either.  A seam between workers on different cores can reach
  the two-core floor, not the one-core one;
- ``grpc``: a unary gRPC call of the same bytes to an in-process echo server with the channel options
  the driver uses: the transport a Forward rides on, without the model;
- ``tls_tcp`` and ``grpc_tls``, in a run whose workers run mutual TLS (``dgr certify --tls``): the
  ``tcp`` and ``grpc`` round trips again over mutual TLS with the run's own identities, so the seam
  tables read each crossing against the same bytes with and without TLS.

Round trips are what is timed (one clock, no skew); a one-way crossing is half of one.  Both figures
are medians with their quartiles: on a loaded machine the spread says how far to trust them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from pipeline.socket_io import recv_exact
from worker.client import CHANNEL_OPTIONS
from worker.tls import Identity, channel_credentials, client_context, server_context, server_credentials

TlsPair = tuple[Identity, Identity]  # the echo's (server's) identity, then the caller's

ECHO_SERVICE = "dgr.floor.Floor"
ECHO = f"/{ECHO_SERVICE}/Echo"


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


def _echo(conn: socket.socket, size: int, count: int) -> None:
    """The far end of a round trip: read ``size`` bytes and send them back, ``count`` times."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(size)
    with conn:
        for _ in range(count):
            recv_exact(conn, memoryview(buf))
            conn.sendall(buf)


def _timed_echoes(sock: socket.socket, size: int, round_trips: int, warmup: int) -> np.ndarray:
    """Seconds per round trip of ``size`` random bytes on ``sock``, whose far end echoes them; refused
    when what came back is not what was sent."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, back = os.urandom(size), bytearray(size)
    times = timed(lambda: (sock.sendall(payload), recv_exact(sock, memoryview(back))), round_trips, warmup)
    if bytes(back) != payload:
        raise RuntimeError("the TCP echo did not return the bytes sent: it measured nothing")
    return times


def tcp_round_trips(size: int, round_trips: int, warmup: int, tls: TlsPair | None = None) -> np.ndarray:
    """Seconds per loopback TCP round trip of ``size`` bytes (an echo thread on the other end); with
    ``tls`` (the echo's identity, ours) over mutual TLS."""
    server = socket.create_server(("127.0.0.1", 0))
    accepting = server_context(tls[0]) if tls is not None else None

    def serve() -> None:
        conn = server.accept()[0]
        far = accepting.wrap_socket(conn, server_side=True) if accepting else conn
        _echo(far, size, warmup + round_trips)

    echo = threading.Thread(target=serve, daemon=True, name="dgr-floor-echo")
    echo.start()
    try:
        with socket.create_connection(server.getsockname()[:2]) as raw:
            sock = client_context(tls[1]).wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw
            with sock:
                times = _timed_echoes(sock, size, round_trips, warmup)
        echo.join(timeout=10)
    finally:
        server.close()
    return times


def echo_process_main(argv: list[str]) -> None:
    """The echo process of tcp_process_round_trips: PORT SIZE COUNT CPU."""
    port, size, count, cpu = (int(a) for a in argv)
    os.sched_setaffinity(0, {cpu})
    try:
        _echo(socket.create_connection(("127.0.0.1", port)), size, count)
    except ConnectionError:
        pass  # the measuring side gave up; it reports why


# this module's package root, so the echo process imports the same code in a checkout and a wheel
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
_ECHO_MAIN = (
    "import sys; from pipeline.transport_floor import echo_process_main; echo_process_main(sys.argv[1:])"
)


def tcp_process_round_trips(size: int, round_trips: int, warmup: int, cpus: tuple[int, int]) -> np.ndarray:
    """Seconds per loopback TCP round trip of ``size`` bytes to an echo in another process; the calling
    thread held to CPU ``cpus[0]`` meanwhile, the echo to ``cpus[1]``."""
    server = socket.create_server(("127.0.0.1", 0))
    path = os.pathsep.join(filter(None, (_PACKAGE_ROOT, os.environ.get("PYTHONPATH"))))
    args = (server.getsockname()[1], size, warmup + round_trips, cpus[1])
    echo = subprocess.Popen(
        [sys.executable, "-c", _ECHO_MAIN, *map(str, args)],
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )
    allowed = os.sched_getaffinity(0)  # this thread's own (pid 0): the caller's other threads keep theirs
    try:
        os.sched_setaffinity(0, {cpus[0]})
        server.settimeout(30)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            times = _timed_echoes(conn, size, round_trips, warmup)
        echo.wait(timeout=30)
    finally:
        os.sched_setaffinity(0, allowed)
        server.close()
        if echo.poll() is None:
            echo.kill()
            echo.wait()
    return times


def grpc_round_trips(size: int, round_trips: int, warmup: int, tls: TlsPair | None = None) -> np.ndarray:
    """Seconds per unary gRPC echo of ``size`` bytes on loopback (in-process server, no model); with
    ``tls`` (the server's identity, the client's) over mutual TLS."""

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    where = "127.0.0.1:0"
    port = (
        server.add_secure_port(where, server_credentials(tls[0])) if tls else server.add_insecure_port(where)
    )
    server.start()
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.secure_channel(target, channel_credentials(tls[1]), options=CHANNEL_OPTIONS)
        if tls
        else grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    )
    try:
        with channel:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(ECHO)
            payload = os.urandom(size)
            times = timed(lambda: call(payload, timeout=10), round_trips, warmup)
            if call(payload, timeout=10) != payload:
                raise RuntimeError("the gRPC echo did not return the bytes sent: it measured nothing")
            return times
    finally:
        server.stop(grace=None)


def core_pairs() -> dict[str, tuple[int, int]]:
    """The CPUs the two ends of the process floors are held to: one core, and two where this process
    may use two."""
    cpus = sorted(os.sched_getaffinity(0))
    pairs = {"one_core": (cpus[0], cpus[0])}
    if len(cpus) > 1:
        pairs["two_cores"] = (cpus[0], cpus[1])
    return pairs


def quartiles(times: np.ndarray) -> dict[str, float]:
    q1, median, q3 = (float(x) for x in np.percentile(times, [25, 50, 75]))
    return {"median": median, "q1": q1, "q3": q3}


def measure(
    sizes: Iterable[int], *, round_trips: int = 300, warmup: int = 50, tls: TlsPair | None = None
) -> dict[str, Any]:
    """Every floor for each distinct boundary size, with the load average they were taken under; with
    ``tls`` (the run's workers' identity, the driver's) the TCP and gRPC floors over mutual TLS too."""
    rows: list[dict[str, Any]] = []
    for size in sorted({int(s) for s in sizes if int(s) > 0}):
        tcp = tcp_round_trips(size, round_trips, warmup)
        rpc = grpc_round_trips(size, round_trips, warmup)
        row = {"bytes": size, "tcp_round_trip_s": quartiles(tcp), "grpc_round_trip_s": quartiles(rpc)}
        if tls is not None:
            row["tls_tcp_round_trip_s"] = quartiles(tcp_round_trips(size, round_trips, warmup, tls))
            row["grpc_tls_round_trip_s"] = quartiles(grpc_round_trips(size, round_trips, warmup, tls))
        for name, cpus in core_pairs().items():
            processes = tcp_process_round_trips(size, round_trips, warmup, cpus)
            row[f"tcp_{name}_round_trip_s"] = quartiles(processes)
        rows.append(row)
    return {"round_trips": round_trips, "load_average": os.getloadavg()[0], "sizes": rows}


def one_way_floor_s(floor: dict[str, Any] | None, size: int, transport: str = "grpc") -> float | None:
    """Half the median round trip of the floor row for ``size`` bytes (None when it was not measured)."""
    for row in (floor or {}).get("sizes", []):
        if row["bytes"] == size:
            return row[f"{transport}_round_trip_s"]["median"] / 2
    return None
