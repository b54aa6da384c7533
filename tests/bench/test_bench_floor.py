"""The transport floor a seam is measured against (issue 19 item 3): one loopback round trip of a
boundary's size with no model, on this machine, in one run.

The measuring is pipeline/transport_floor.py's, the same code the certificate's floor figures come
from; here with more round trips.

- tcp: a bare TCP round trip over loopback (TCP_NODELAY, a thread echoing the bytes back): a syscall
  pair and a copy each way, the physical floor for a Python driver on this box;
- tcp between processes on 1 core / on 2 cores: the same round trip with the echo in another process,
  both ends held to one core, then each to its own: the floor a seam between two workers reaches,
  depending on whether the scheduler runs them on one core or two;
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

import pytest

from pipeline.transport_floor import measure

pytestmark = pytest.mark.slow

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10}
ROUND_TRIPS = 2000
WARMUP = 200
FLOORS = {
    "tcp": "tcp",
    "tcp_one_core": "tcp between processes on one core",
    "tcp_two_cores": "tcp between processes on two cores",
    "grpc": "grpc unary",
}


def _describe(q: dict[str, float]) -> str:
    return f"median {q['median'] * 1e6:.1f} us (IQR {q['q1'] * 1e6:.1f}-{q['q3'] * 1e6:.1f})"


@pytest.mark.parametrize("label", list(SIZES))
def test_bench_transport_floor(benchmark, label: str) -> None:
    floor = measure([SIZES[label]], round_trips=ROUND_TRIPS, warmup=WARMUP)
    (row,) = floor["sizes"]
    got = {name: row[f"{name}_round_trip_s"] for name in FLOORS if f"{name}_round_trip_s" in row}
    ratio = got["grpc"]["median"] / got["tcp"]["median"]
    benchmark.extra_info.update(
        bytes=row["bytes"],
        grpc_over_tcp=ratio,
        **{f"{name}_median_s": q["median"] for name, q in got.items()},
    )
    benchmark.pedantic(lambda: None, rounds=1)  # the figures are the round trips above, not this call
    figures = "; ".join(f"{FLOORS[name]} {_describe(q)}" for name, q in got.items())
    print(
        f"\n[bench] floor {label}: {figures}; grpc/tcp {ratio:.1f}x; load average {floor['load_average']:.2f}"
    )
