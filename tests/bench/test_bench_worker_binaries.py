"""This build's worker against another worker binary, side by side in one run: a change to the worker's
per-pass path (parsing, copies, bookkeeping) measured where it weighs most, many stages sharing cores.

Set ``DGR_BENCH_BASELINE_WORKER`` to the other binary (for example the ``bin/dgr-shard-worker`` of
a build made before the change; copy it out first, a rebuild replaces it).  Every placement of
tests/bench/placements.py runs with both, as a token-only ring at one thread per worker, interleaved
over ROUNDS rounds; the table gives each way's tok/s, ratio to the better monolithic median, seam and
every worker's CPU time per token (where stages share cores, the token's cost is that sum).

Two launches of one binary can differ by 10-20% on a shared VM (worker/README.md, "CPU affinity"):
each binary is launched once per run here, so run the bench two or three times before reading a
difference of a few percent as the change's.  Skipped without the variable.
A figure of this machine, not a pass/fail property: the only assertion is that every run decoded.
Run: ``DGR_BENCH_BASELINE_WORKER=/path/to/dgr-shard-worker nox -s bench -- -s -k worker_binaries``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tests.bench.ways import compare_ways

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUNDS = 3
BASELINE = "DGR_BENCH_BASELINE_WORKER"


def test_bench_this_worker_against_a_baseline(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    baseline = os.environ.get(BASELINE)
    if not baseline:
        pytest.skip(f"set {BASELINE} to the worker binary to compare this build's with")
    if not os.access(baseline, os.X_OK):
        pytest.fail(f"{BASELINE}={baseline}: not an executable file")
    ways = {
        "baseline": dataclasses.replace(worker_command, program=(baseline,), threads=1),
        "this build": dataclasses.replace(worker_command, threads=1),
    }
    table = compare_ways(
        ways, rounds=ROUNDS, benchmark=benchmark, stubs=stubs, env=worker_env, evidence=tmp_path
    )
    table.publish(
        "worker binaries",
        f"tiny-llama token-only ring, 1 thread per worker, loopback; baseline "
        f"{Path(baseline).name} at {baseline}",
        benchmark,
        baseline=baseline,
    )
