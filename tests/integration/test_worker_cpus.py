"""--cpus on the real worker: a bad CPU list or a CPU this process may not use is a one-line usage
error (exit 2) before the model loads; a pinned worker's threads (gRPC's, ggml's, the ring's passes)
are held to its list but for the ring's delivery thread, which only talks to the driver and runs where
the worker could before; and pinning changes no token."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from pipeline import drive, routes
from tests.integration.conftest import our_workers
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BAD_LISTS = {
    "x": "expected a CPU list such as 0-3,8",
    "3-1": "range '3-1' runs backwards",
    "0-1,": "expected a CPU list",
    "": "expected a CPU list",
    "-1": "expected a CPU list",
    "1024": "CPU 1024 is past the last one",
}


def _exit_of(worker_command, cpus: str) -> subprocess.CompletedProcess:
    argv = worker_command.argv((0, 12)) + ["--cpus", cpus]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("bad", sorted(BAD_LISTS))
def test_a_bad_cpu_list_is_a_usage_error(worker_command, bad) -> None:
    done = _exit_of(worker_command, bad)
    assert done.returncode == 2, done.stderr
    assert f"--cpus: {BAD_LISTS[bad]}" in done.stderr.splitlines()[0]


def test_a_cpu_this_process_may_not_use_is_refused(worker_command) -> None:
    beyond = max(os.sched_getaffinity(0)) + 1  # absent here, or outside what we may use
    done = _exit_of(worker_command, f"{min(os.sched_getaffinity(0))},{beyond}")
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith(
        f"dgr-shard-worker: --cpus: CPU {beyond} cannot be used here (this process may use CPUs"
    )
    assert "\n" not in line


def _allowed_per_thread(pid: int) -> dict[str, set[frozenset[int]]]:
    """Thread name -> the CPU sets its threads may run on (sched_getaffinity takes a thread id)."""
    sets: dict[str, set[frozenset[int]]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = (task / "comm").read_text().strip()
        sets.setdefault(name, set()).add(frozenset(os.sched_getaffinity(int(task.name))))
    return sets


def test_pinned_stages_keep_every_thread_on_their_cpu_and_decode_alike(
    worker_command, stubs, worker_env, tmp_path
) -> None:
    cpu = str(min(os.sched_getaffinity(0)))
    pinned = dataclasses.replace(worker_command, cpus=(cpu,))
    with launch(pinned, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "pinned", env=worker_env) as p:
        prompts = [p.clients[0].tokenize("Pinning moves no token.", add_special=True)]
        tokens = drive.run_placement(p.clients, prompts, 8, route=routes.Ring()).prompts[0].tokens
        for pid in p.pids:
            allowed = _allowed_per_thread(pid)
            assert allowed.pop("dgr-deliver") == {frozenset(os.sched_getaffinity(0))}
            assert set().union(*allowed.values()) == {frozenset({int(cpu)})}
        assert [i.cpus for i in drive.describe(p.clients)] == [cpu, cpu]  # Info says so (the certificate's)
    with launch(
        worker_command, [(0, 6), (6, 12)], stubs=stubs, evidence=tmp_path / "free", env=worker_env
    ) as p:
        assert drive.run_placement(p.clients, prompts, 8, route=routes.Ring()).prompts[0].tokens == tokens
        assert [i.cpus for i in drive.describe(p.clients)] == ["", ""]
    assert our_workers(worker_command.program[0]) == []
