"""A worker at --threads N computes on one thread, whichever thread a pass comes in on.

ggml's CPU backend runs a graph on an OpenMP team, and libgomp keeps a team per calling thread; a
worker that decoded on every gRPC thread that took a Forward grew a team per thread, libgomp then
managed more threads than there are CPUs and slept at every barrier instead of spinning: decodes at
2 threads were 4-5x slower than at 1 (worker/README.md, "Threads"). The speed is `nox -s bench`'s
business; this holds the cause away: the decode work of concurrent sessions (several gRPC threads)
and of a ring (the pass reader) is done by N threads, the compute thread and its team, named
dgr-compute, and the sessions decode as they do alone.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import drive, routes
from pipeline.concurrency import decode_together, diverging
from tests.integration.conftest import our_workers
from tests.proc_ticks import Ticks, cpu_ticks
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TEXT = "Every graph of a worker runs on one OpenMP team."
N_DECODE = 48
SESSIONS = 4
# a thread that did at least this share of the worker's CPU time computed (the rest parse and send)
COMPUTED = 0.1


def _threads_that_computed(before: Ticks, after: Ticks) -> list[str]:
    spent = {tid: (name, ticks - before.get(tid, (name, 0))[1]) for tid, (name, ticks) in after.items()}
    total = sum(t for _, t in spent.values())
    assert total > 0, "the worker used no CPU time while it decoded"
    return sorted(name for name, t in spent.values() if t >= COMPUTED * total)


@pytest.mark.parametrize("threads", [2, 3])
def test_every_pass_computes_on_one_team(threads, worker_command, stubs, worker_env, tmp_path) -> None:
    command = dataclasses.replace(worker_command, threads=threads, max_sessions=SESSIONS)
    with launch(command, [(0, 12)], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        pid = p.pids[0]
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        alone = decode_together(p.clients, prompt, N_DECODE, 1).sessions[0]
        before = cpu_ticks(pid)
        together = decode_together(p.clients, prompt, N_DECODE, SESSIONS)  # on several gRPC threads
        relayed = _threads_that_computed(before, cpu_ticks(pid))
        before = cpu_ticks(pid)
        ring = drive.run_placement(p.clients, [prompt], N_DECODE, route=routes.Ring()).prompts[0].tokens
        ringed = _threads_that_computed(before, cpu_ticks(pid))
    assert diverging(together, alone) == []
    assert ring == alone.tokens
    # the team may leave a member idle through a small graph, never more threads than the team
    assert set(relayed) == {"dgr-compute"} and len(relayed) <= threads, relayed
    assert set(ringed) == {"dgr-compute"} and len(ringed) <= threads, ringed
    assert our_workers(worker_command.program[0]) == []
