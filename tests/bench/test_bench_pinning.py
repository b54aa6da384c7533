"""Ring decode with the stages free to move against the same stages on one CPU (--cpus), in one run.

A ring hands every pass to the next stage, so each token waits for one wake-up per stage.  On a host
that runs several stages the scheduler may wake the next stage on another core: on a VM that can cost
more than the switch itself, and the boundary the stage reads is then in the other core's cache.
This bench measures what choosing the cores (worker --cpus, WorkerCommand.cpus) changes: every
placement decoded as a token-only ring twice, free and with all its stages on the first CPU this
process may use, interleaved over ROUNDS rounds; the monolithic worker both ways too.  Each figure's
ratio is to the better of the two monolithic medians, so pinning is never credited with a slower
reference.  The driver is left free in both.

A figure of this machine, not a pass/fail property: the only assertion is that every run decoded
(tests/integration/test_worker_cpus.py holds pinned and free to the same tokens).
Run: ``nox -s bench -- -s -k pinning``.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import ExitStack

import pytest

from certify.metrics import median_iqr
from pipeline import drive
from tests.bench.placements import PLACEMENTS
from tests.integration import conftest as shared
from worker.launcher import launch

real_ctx, cpu_build, tiny_model = shared.real_ctx, shared.cpu_build, shared.tiny_model
stubs, worker_command, worker_env = shared.stubs, shared.worker_command, shared.worker_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

N_DECODE = 65
ROUNDS = 3
PROMPT = "Once upon a time"


def _decode(clients, prompt) -> list[float]:
    speed = drive.measure_speed(clients, prompt, N_DECODE, repetitions=3, warmup=1, forwarding="ring",
                                ring_logits=False)
    return list(speed.decode_tok_s)


def test_bench_pinned_against_free(benchmark, worker_command, stubs, worker_env, tmp_path) -> None:
    cpu = str(min(os.sched_getaffinity(0)))
    ways = {"free": dataclasses.replace(worker_command, threads=1),
            f"cpu {cpu}": dataclasses.replace(worker_command, threads=1, cpus=(cpu,))}
    load_before = os.getloadavg()
    tok_s = {(name, way): [] for name in PLACEMENTS for way in ways}
    with ExitStack() as running:
        groups = {(name, way): running.enter_context(
                      launch(cmd, placement, stubs=stubs, env=worker_env,
                             evidence=tmp_path / f"{name}-{way}".replace(" ", "-"))).clients
                  for name, placement in PLACEMENTS.items() for way, cmd in ways.items()}
        prompt = groups[("monolithic", "free")][0].tokenize(PROMPT, add_special=True)

        def sweep() -> None:
            for _ in range(ROUNDS):
                for key, clients in groups.items():
                    tok_s[key] += _decode(clients, prompt)

        benchmark.pedantic(sweep, rounds=1, iterations=1)
    load_after = os.getloadavg()
    medians = {key: median_iqr(v) for key, v in tok_s.items()}
    mono = max(medians[("monolithic", way)].median for way in ways)
    header = " ".join(f"{way + ' tok/s':>14} {'IQR':>6} {'/mono':>6}" for way in ways)
    lines = [f"{'placement':<11} {header}"]
    for name in PLACEMENTS:
        cells = [f"{medians[(name, w)].median:14.1f} {medians[(name, w)].iqr:6.1f} "
                 f"{medians[(name, w)].median / mono:6.2f}" for w in ways]
        lines.append(f"{name:<11} " + " ".join(cells))
    print(f"\n[bench pinning] tiny-llama token-only ring, 1 thread per worker, loopback, median of "
          f"{ROUNDS * 3} runs x {N_DECODE - 1} tokens; /mono = ratio to the better monolithic median "
          f"({mono:.1f} tok/s); {os.cpu_count()} cpus, this process may use "
          f"{sorted(os.sched_getaffinity(0))}; "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n  " + "\n  ".join(lines))
    benchmark.extra_info.update(
        table={f"{n}/{w}": {"tok_s": m.median, "iqr": m.iqr, "ratio_to_monolithic": m.median / mono}
               for (n, w), m in medians.items()},
        load_before=list(load_before), load_after=list(load_after))
    assert all(v > 0 for samples in tok_s.values() for v in samples)
