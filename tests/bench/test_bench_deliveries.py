"""A ring's deliveries as frames on the driver's delivery port against a Deliver call each, in one run.

A ring's last stage hands every token to the driver.  As a gRPC Deliver call that took about 440 us
of CPU per token between the worker's delivery and gRPC threads and the driver's gRPC server, and on a
host whose cores the stages share, that CPU is the stages' (worker/README.md, "Ring decode").  The
frames way (Ring.delivery_stream, pipeline/delivery_port.py) sends each delivery as one
length-prefixed message on a connection the last stage keeps open to the driver.  Both ways run the
same workers (one launch per placement), a token-only ring, one thread per worker, free, interleaved
over ROUNDS rounds; the table gives each way's tok/s, its ratio to the better monolithic median,
the workers' CPU per token and the driver's (this process, every thread).

A figure of this machine, not a pass/fail property: the only assertion is that every run decoded
(tests/integration/test_ring.py holds both ways to the same tokens and logits).
Run: ``nox -s bench -- -s -k deliveries``.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.bench.ways import compare_ways

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUNDS = 3


def test_bench_delivery_port_against_deliver_calls(
    benchmark, worker_command, stubs, worker_env, tmp_path
) -> None:
    free = dataclasses.replace(worker_command, threads=1)
    ways = {"frames": free, "Deliver calls": free}
    table = compare_ways(
        ways,
        rounds=ROUNDS,
        benchmark=benchmark,
        stubs=stubs,
        env=worker_env,
        evidence=tmp_path,
        deliver_calls=frozenset({"Deliver calls"}),
    )
    table.publish(
        "deliveries",
        "tiny-llama token-only ring, 1 thread per worker, loopback, free: deliveries "
        "as frames on the driver's delivery port against Deliver calls",
        benchmark,
    )
