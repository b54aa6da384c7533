"""Ring decode with the stages free to move against the same stages on one CPU (--cpus), and against
a driver that does not yield to them, in one run.

A ring hands every pass to the next stage, so each token waits for one wake-up per stage.  On a host
that runs several stages the scheduler may wake the next stage on another core: on a VM that can cost
more than the switch itself, and the boundary the stage reads is then in the other core's cache.
This bench measures what choosing the cores (worker --cpus, WorkerCommand.cpus) changes: every
placement decoded as a token-only ring, free and with all its stages on the first CPU this process
may use, interleaved over ROUNDS rounds; the monolithic worker every way too.  Each figure's ratio
is to the best of the monolithic medians, so pinning is never credited with a slower
reference.  The driver is left free in all three ways.  The third way, "free, driver keeps", is the
first with the driver's threads keeping their scheduling policy while it reads the ring: a delivery's
wake-up may then preempt a stage mid-compute (pipeline/yielding.py).

A figure of this machine, not a pass/fail property: the only assertion is that every run decoded
(tests/integration/test_worker_cpus.py holds pinned and free to the same tokens).
Run: ``nox -s bench -- -s -k pinning``.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from tests.bench.ways import compare_ways

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUNDS = 3


def test_bench_pinned_against_free(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    cpu = str(min(os.sched_getaffinity(0)))
    free = dataclasses.replace(worker_command, threads=1)
    ways = {
        "free": free,
        f"cpu {cpu}": dataclasses.replace(worker_command, threads=1, cpus=(cpu,)),
        "free, driver keeps": free,
    }
    table = compare_ways(
        ways,
        rounds=ROUNDS,
        benchmark=benchmark,
        stubs=stubs,
        env=worker_env,
        evidence=tmp_path,
        driver_keeps=frozenset({"free, driver keeps"}),
    )
    table.publish(
        "pinning",
        f"tiny-llama token-only ring, 1 thread per worker, loopback; this process may "
        f"use CPUs {sorted(os.sched_getaffinity(0))}",
        benchmark,
    )
