"""Where the monolithic worker computes, relayed, in one run: free, or kept on one CPU.

Driven relayed (one Forward call per token), the driver and a free worker take turns on the cores,
and each token's llama_decode may start on the other core from the previous one.  On the 2-core VM
this project is measured on that move costs the pass a good part of its compute: the weights and
the KV cache it reads are then in the other core's caches (worker/README.md, "CPU affinity").  Three
ways, interleaved over ROUNDS rounds: everything free; the driver held to
the last CPU this process may use (the worker free; the first way's worker); the worker held to the
first (--cpus; the driver free).  Figures: the worker's own llama_decode time per token
(compute_seconds) and the tokens per second the driver saw, medians over every token.

A figure of this machine, not a pass/fail property: the only assertion is that every call decoded.
Run: ``nox -s bench -- -s -k migration``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from certify.metrics import median_iqr
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

N_TOKENS = 64
ROUNDS = 4


@contextmanager
def driver_held_to(cpus: set[int] | None) -> Iterator[None]:
    """Every thread of this process (gRPC's included) on ``cpus`` while inside; None: unchanged."""
    if cpus is None:
        yield
        return
    tasks = [int(t) for t in os.listdir("/proc/self/task")]
    before = {t: os.sched_getaffinity(t) for t in tasks}
    for t in tasks:
        os.sched_setaffinity(t, cpus)
    try:
        yield
    finally:
        for t, mask in before.items():
            try:
                os.sched_setaffinity(t, mask)
            except ProcessLookupError:
                pass


def _relayed_tokens(client, prompt: list[int]) -> tuple[list[float], list[float]]:
    """Each single-token Forward's compute_seconds and the driver's seconds per token, greedy."""
    session = f"migration-{uuid.uuid4().hex[:8]}"
    try:
        token = int(client.forward(session, 1, range(len(prompt)), tokens=prompt).logits[-1].argmax())
        computed, walls = [], []
        for pos in range(len(prompt), len(prompt) + N_TOKENS):
            started = time.perf_counter()
            got = client.forward(session, 1, [pos], tokens=[token])
            token = int(got.logits[-1].argmax())
            walls.append(time.perf_counter() - started)
            computed.append(got.compute_seconds)
        return computed, walls
    finally:
        client.reset(session)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to move between")
def test_bench_worker_kept_on_one_cpu(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    mine = sorted(os.sched_getaffinity(0))
    first, last = mine[0], mine[-1]
    free = dataclasses.replace(worker_command, threads=1)
    ways = {
        "all free": (free, None),
        f"driver on cpu {last}": (free, {last}),
        f"worker on cpu {first}": (dataclasses.replace(free, cpus=(str(first),)), None),
    }
    compute = {way: [] for way in ways}
    token_s = {way: [] for way in ways}
    load_before = os.getloadavg()
    with ExitStack() as running:
        # the two free ways share one worker: two launches of one binary can differ by 10-20%
        launched = {}
        for k, (cmd, _) in enumerate(ways.values()):
            if cmd not in launched:
                launched[cmd] = running.enter_context(
                    launch(cmd, [(0, 12)], stubs=stubs, env=worker_env, evidence=tmp_path / str(k))
                ).clients[0]
        clients = {way: launched[cmd] for way, (cmd, _) in ways.items()}
        prompt = next(iter(clients.values())).tokenize("Once upon a time", add_special=True)

        def sweep() -> None:
            for _ in range(ROUNDS):
                for way, (_, driver_cpus) in ways.items():
                    with driver_held_to(driver_cpus):
                        computed, walls = _relayed_tokens(clients[way], prompt)
                    compute[way] += computed
                    token_s[way] += walls

        benchmark.pedantic(sweep, rounds=1, iterations=1)
    load_after = os.getloadavg()
    lines = [f"{'way':<16} {'llama_decode ms':>15} {'IQR':>6} {'tok/s':>7}"]
    for way in ways:
        c, w = median_iqr(compute[way]), median_iqr(token_s[way])
        lines.append(f"{way:<16} {c.median * 1e3:15.3f} {c.iqr * 1e3:6.3f} {1 / w.median:7.1f}")
    print(
        f"\n[bench migration] tiny-llama monolithic worker, 1 thread, relayed, one token per call; "
        f"median of {ROUNDS * N_TOKENS} tokens per way; CPUs {mine}; load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f}\n  " + "\n  ".join(lines)
    )
    benchmark.extra_info.update(
        compute_ms={w: median_iqr(v).median * 1e3 for w, v in compute.items()},
        tok_s={w: 1 / median_iqr(v).median for w, v in token_s.items()},
        load_before=list(load_before),
        load_after=list(load_after),
    )
    assert all(v > 0 for values in compute.values() for v in values)
