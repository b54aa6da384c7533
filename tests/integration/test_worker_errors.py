"""Issue 4 must-show: requests that do not fit a stage, a killed stage and an unknown session each give
the caller a clear error naming the stage, and the launcher leaves no worker process behind."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from pipeline import drive
from tests.integration.conftest import our_workers, proc_alive
from worker.client import StageClient, StageFailed
from worker.launcher import launch

# The first test of a fresh checkout builds the CPU lane inside its fixture: allow for that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

PLACEMENT = [(0, 4), (4, 8), (8, 12)]


@pytest.fixture
def pipeline(worker_command, stubs, worker_env, tmp_path):
    with launch(
        worker_command, PLACEMENT, stubs=stubs, evidence=tmp_path / "ev", env=worker_env, call_deadline=60
    ) as p:
        yield p
    assert not any(proc_alive(pid) for pid in p.pids)
    assert our_workers(worker_command.program[0]) == []


def _prompt(p) -> list[int]:
    return p.clients[0].tokenize("Errors must name the stage that failed.", add_special=True)


def test_wrong_boundary_width(pipeline) -> None:
    info = pipeline.clients[1].info()
    bad = np.zeros((2, info.boundary_width + 1), np.float32)
    with pytest.raises(StageFailed, match=r"stage 1 \(layers 4:8\) failed: INVALID_ARGUMENT") as caught:
        pipeline.clients[1].forward("s-width", 1, [0, 1], boundary=bad)
    print(f"\n[error] wrong width: {caught.value}")
    assert caught.value.exit_code == 6


def test_boundary_rows_must_match_positions(pipeline) -> None:
    width = pipeline.clients[1].info().boundary_width
    with pytest.raises(StageFailed, match="INVALID_ARGUMENT"):
        pipeline.clients[1].forward("s-rows", 1, [0, 1, 2], boundary=np.zeros((2, width), np.float32))


def test_missing_boundary_on_a_later_stage(pipeline) -> None:
    with pytest.raises(StageFailed, match=r"stage 2 \(layers 8:12\) failed: INVALID_ARGUMENT"):
        pipeline.clients[2].forward("s-none", 1, [0], tokens=[1])


def test_positions_that_skip_ahead(pipeline) -> None:
    client = pipeline.clients[0]
    prompt = _prompt(pipeline)
    client.forward("s-gap", 1, list(range(len(prompt))), tokens=prompt)
    with pytest.raises(StageFailed, match="FAILED_PRECONDITION") as caught:
        client.forward("s-gap", 1, [len(prompt) + 3], tokens=[1])
    print(f"\n[error] gap: {caught.value}")
    assert client.reset("s-gap") is True


def test_unknown_session(pipeline) -> None:
    with pytest.raises(StageFailed, match=r"stage 0 \(layers 0:4\) failed: NOT_FOUND") as caught:
        pipeline.clients[0].forward("never-started", 1, [7], tokens=[1])
    print(f"\n[error] unknown session: {caught.value}")
    assert pipeline.clients[0].reset("never-started") is False


def test_stale_epoch_is_refused(pipeline) -> None:
    client = pipeline.clients[0]
    prompt = _prompt(pipeline)
    client.forward("s-epoch", 5, list(range(len(prompt))), tokens=prompt)
    with pytest.raises(StageFailed, match="FAILED_PRECONDITION"):
        client.forward("s-epoch", 4, [len(prompt)], tokens=[1])
    client.reset("s-epoch")


class _KillsBeforeCall:
    """Wraps a real client: on its n-th Forward it SIGKILLs the real worker first (a stage lost mid-run)."""

    def __init__(self, client: StageClient, pid: int, on_call: int) -> None:
        self._client, self._pid, self._on_call, self._calls = client, pid, on_call, 0

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def forward(self, *args, **kwargs):
        self._calls += 1
        if self._calls == self._on_call:
            os.kill(self._pid, signal.SIGKILL)
        return self._client.forward(*args, **kwargs)


def test_killed_stage_mid_run(worker_command, stubs, worker_env, tmp_path) -> None:
    with launch(worker_command, PLACEMENT, stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        prompt = _prompt(p)
        victim = p.stages[1]
        clients = list(p.clients)
        clients[1] = _KillsBeforeCall(clients[1], victim.pid, on_call=5)  # prefill, then decode steps
        started = time.monotonic()
        with pytest.raises(StageFailed) as caught:
            drive.run_placement(clients, [prompt], 16)
        took = time.monotonic() - started
        pids = p.pids
    msg = str(caught.value)
    print(f"\n[error] killed stage: {msg} (after {took:.2f} s)")
    assert "stage 1 (layers 4:8) failed: DIED: worker was killed by SIGKILL" in msg
    assert took < 30
    assert not any(proc_alive(pid) for pid in pids)
    assert our_workers(worker_command.program[0]) == []
    assert (tmp_path / "ev" / "stage-1-layers-4-8.stderr").is_file()


def test_hung_stage_hits_the_deadline_and_is_stopped(worker_command, stubs, worker_env, tmp_path) -> None:
    with launch(
        worker_command,
        [(0, 6), (6, 12)],
        stubs=stubs,
        evidence=tmp_path / "ev",
        env=worker_env,
        call_deadline=2.0,
        grace=2.0,
    ) as p:
        prompt = _prompt(p)
        os.kill(p.stages[1].pid, signal.SIGSTOP)  # alive but answering nothing
        with pytest.raises(StageFailed, match=r"stage 1 \(layers 6:12\) failed: DEADLINE_EXCEEDED"):
            drive.run_placement(p.clients, [prompt], 4)
        pids = p.pids
    assert not any(proc_alive(pid) for pid in pids)


def test_worker_refuses_a_bad_range_at_start(worker_command, stubs, worker_env, tmp_path) -> None:
    with pytest.raises(StageFailed, match=r"stage 1 \(layers 6:40\) failed: DIED: worker exited with code"):
        with launch(
            worker_command,
            [(0, 6), (6, 40)],
            stubs=stubs,
            evidence=tmp_path / "ev",
            env=worker_env,
            start_timeout=120,
        ):
            pass
    assert our_workers(worker_command.program[0]) == []
