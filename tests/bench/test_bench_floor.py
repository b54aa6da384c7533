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

import os

import numpy as np
import pytest

from pipeline.transport_floor import core_pairs, grpc_round_trips, tcp_process_round_trips, tcp_round_trips

pytestmark = pytest.mark.slow

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10}
ROUND_TRIPS = 2000
WARMUP = 200


def _describe(times: np.ndarray) -> str:
    q1, med, q3 = np.percentile(times, [25, 50, 75]) * 1e6
    return f"median {med:.1f} us (IQR {q1:.1f}-{q3:.1f})"


@pytest.mark.parametrize("label", list(SIZES))
def test_bench_transport_floor(benchmark, label: str) -> None:
    size = SIZES[label]
    tcp = tcp_round_trips(size, ROUND_TRIPS, WARMUP)
    rpc = grpc_round_trips(size, ROUND_TRIPS, WARMUP)
    processes = {name: tcp_process_round_trips(size, ROUND_TRIPS, WARMUP, cpus)
                 for name, cpus in core_pairs().items()}
    ratio = float(np.median(rpc) / np.median(tcp))
    benchmark.extra_info.update(bytes=size, tcp_median_s=float(np.median(tcp)),
                                grpc_median_s=float(np.median(rpc)), grpc_over_tcp=ratio,
                                **{f"tcp_{n}_median_s": float(np.median(t)) for n, t in processes.items()})
    benchmark.pedantic(lambda: None, rounds=1)  # the figures are the round trips above, not this call
    between = "; ".join(f"tcp between processes on {n.replace('_', ' ')} {_describe(t)}"
                        for n, t in processes.items())
    print(f"\n[bench] floor {label}: tcp {_describe(tcp)}; {between}; grpc unary {_describe(rpc)}; "
          f"grpc/tcp {ratio:.1f}x; load average {os.getloadavg()[0]:.2f}")
