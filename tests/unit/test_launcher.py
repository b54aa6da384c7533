"""worker/launcher.py against a real child process serving the real proto (the Python fake worker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigurationError, ToolchainMissing
from tests.unit.fake_stages import fake_command, fake_env, load_stubs, running
from worker.client import StageFailed
from worker.launcher import Placed, WorkerCommand, check_placement, launch

PLACEMENT = [(0, 4), (4, 8), (8, 12)]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


def _launch(stubs, tmp_path: Path, placement=PLACEMENT, **kw):
    faults = kw.pop("faults", {})
    return launch(
        fake_command(tmp_path),
        placement,
        stubs=stubs,
        evidence=tmp_path / "evidence",
        env=fake_env(stubs, **faults),
        **kw,
    )


def test_starts_every_stage_and_stops_them_all(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path) as pipeline:
        pids = pipeline.pids
        assert all(running(p) for p in pids)
        infos = [c.info() for c in pipeline.clients]
        assert [(i.layer_begin, i.layer_end) for i in infos] == PLACEMENT
        assert all(c.health() == (True, "ok") for c in pipeline.clients)
        pipeline.check_alive()
    assert not any(running(p) for p in pids)
    evidence = tmp_path / "evidence"
    assert (evidence / "stage-1-layers-4-8.stderr").is_file()
    assert "DGR-WORKER-LISTENING" in (evidence / "stage-2-layers-8-12.stdout").read_text()
    record = (evidence / "stages.json").read_text()
    assert '"returncode"' in record and "--layers" in record


def test_reused_evidence_folder_finds_the_new_address(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, [(0, 12)]):
        pass
    # Before the fix the first run's (dead) address was found again and Health timed out.
    with _launch(stubs, tmp_path, [(0, 12)], start_timeout=10) as second:
        assert second.clients[0].health()[0]
    assert (tmp_path / "evidence" / "stage-0-layers-0-12.stdout").read_text().count("LISTENING") == 2


@pytest.mark.parametrize("error", [RuntimeError("gate blew up"), KeyboardInterrupt()])
def test_workers_stopped_when_the_body_raises(stubs, tmp_path: Path, error: BaseException) -> None:
    seen: list[int] = []
    with pytest.raises(type(error)):
        with _launch(stubs, tmp_path) as pipeline:
            seen = pipeline.pids
            raise error
    assert len(seen) == 3 and not any(running(p) for p in seen)


def test_worker_exiting_at_start_names_stage_and_stderr(stubs, tmp_path: Path) -> None:
    with pytest.raises(StageFailed) as caught:
        faults = {"DGR_FAKE_FAULT": "exit-at-start", "DGR_FAKE_FAULT_BEGIN": "4"}
        with _launch(stubs, tmp_path, faults=faults):
            pytest.fail("launch must not succeed")
    msg = str(caught.value)
    assert "stage 1 (layers 4:8) failed" in msg and "exited with code 3" in msg
    assert "refusing to start" in msg
    _assert_all_reaped(tmp_path)


def test_worker_that_never_listens_times_out(stubs, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(StageFailed, match=r"stage 0 \(layers 0:4\) failed: START_TIMEOUT"):
        with _launch(
            stubs,
            tmp_path,
            faults={"DGR_FAKE_FAULT": "no-listen", "DGR_FAKE_FAULT_BEGIN": "0"},
            start_timeout=3,
        ):
            pass
    assert time.monotonic() - started < 15
    _assert_all_reaped(tmp_path)


def test_worker_ignoring_sigterm_is_killed_after_grace(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, [(0, 12)], faults={"DGR_FAKE_FAULT": "ignore-sigterm"}, grace=1.0) as p:
        pid = p.pids[0]
        started = time.monotonic()
    assert 0.9 < time.monotonic() - started < 10
    assert not running(pid)
    assert p.stages[0].process.returncode == -signal.SIGKILL


def test_killed_worker_is_detected_and_named(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path) as pipeline:
        victim = pipeline.stages[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.wait(timeout=10)
        died = r"stage 1 \(layers 4:8\) failed: DIED: worker was killed by SIGKILL"
        with pytest.raises(StageFailed, match=died):
            pipeline.check_alive()
        with pytest.raises(StageFailed, match=r"stage 1 \(layers 4:8\) failed: DIED") as caught:
            pipeline.clients[1].info()
        assert caught.value.exit_code == 6
    _assert_all_reaped(tmp_path)


def test_hung_worker_hits_the_call_deadline(stubs, tmp_path: Path) -> None:
    with _launch(
        stubs, tmp_path, [(0, 12)], faults={"DGR_FAKE_FAULT": "hang-forward"}, call_deadline=1.0, grace=1.0
    ) as pipeline:
        client = pipeline.clients[0]
        with pytest.raises(StageFailed, match="DEADLINE_EXCEEDED: Forward got no reply within 1.0 s"):
            client.forward("s", 1, [0], tokens=[1])
    _assert_all_reaped(tmp_path)


def test_malformed_tensor_is_a_stage_failure(stubs, tmp_path: Path) -> None:
    with _launch(stubs, tmp_path, [(0, 12)], faults={"DGR_FAKE_FAULT": "bad-shape"}) as pipeline:
        with pytest.raises(StageFailed, match=r"stage 0 \(layers 0:12\) failed: BAD_REPLY: .*logits"):
            pipeline.clients[0].forward("s", 1, [0, 1], tokens=[1, 2], all_logits=True)


def test_missing_worker_binary_fails_before_starting(stubs, tmp_path: Path) -> None:
    cmd = WorkerCommand(program=(str(tmp_path / "no-such-worker"),), model=tmp_path / "m.gguf")
    with pytest.raises(ToolchainMissing):
        with launch(cmd, [(0, 12)], stubs=stubs, evidence=tmp_path / "ev", env=dict(os.environ)):
            pass


@pytest.mark.parametrize("placement", [[], [(0, 4), (5, 12)], [(0, 4), (4, 4), (4, 12)], [(1, 12)]])
def test_bad_placements_are_refused(placement) -> None:
    with pytest.raises(ConfigurationError):
        check_placement(placement, 12)


def test_placement_must_cover_the_model() -> None:
    with pytest.raises(ConfigurationError, match="ends at layer 8"):
        check_placement([(0, 8)], 12)


def _assert_all_reaped(tmp_path: Path) -> None:
    import json

    record = json.loads((tmp_path / "evidence" / "stages.json").read_text())
    assert record["stages"], "the launcher recorded no stage"
    for stage in record["stages"]:
        assert stage["returncode"] is not None
        assert not running(stage["pid"])


def test_default_command_line_listens_on_loopback(tmp_path: Path) -> None:
    cmd = WorkerCommand(program=("w",), model=tmp_path / "m.gguf", threads=3)
    argv = cmd.argv((2, 5))
    assert argv == [
        "w",
        "--model",
        os.fspath(tmp_path / "m.gguf"),
        "--layers",
        "2:5",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "3",
    ]
    assert cmd.argv((2, 5), listen="10.1.2.3:0")[6] == "10.1.2.3:0"


def test_cpu_lists_go_to_the_stages_in_turn(tmp_path: Path) -> None:
    cmd = WorkerCommand(program=("w",), model=tmp_path / "m.gguf", cpus=("0", "1-3"))

    def cpus_of(stage: int) -> str:
        argv = cmd.argv((0, 1), stage=stage)
        return argv[argv.index("--cpus") + 1]

    assert [cpus_of(k) for k in range(4)] == ["0", "1-3", "0", "1-3"]
    free = WorkerCommand(program=("w",), model=tmp_path / "m.gguf")
    assert "--cpus" not in free.argv((0, 1), stage=3)


def test_a_load_mode_goes_to_every_stage(tmp_path: Path) -> None:
    from core.environment import worker_load

    model = tmp_path / "m.gguf"
    cmd = WorkerCommand(program=("w",), model=model, load=worker_load({"DGR_WORKER_LOAD": "mmap"}))
    for k in range(3):
        argv = cmd.argv((0, 1), stage=k)
        assert argv[argv.index("--load") + 1] == "mmap"
    default = WorkerCommand(program=("w",), model=tmp_path / "m.gguf", load=worker_load({}))
    assert "--load" not in default.argv((0, 1))


def test_placed_stages_run_behind_a_prefix_on_the_asked_host(stubs, tmp_path: Path) -> None:
    # `env` execs its program like `ip netns exec` does: the pid we hold and signal is the worker's.
    placed = [Placed(prefix=("env",), host="127.0.0.1"), Placed()]
    with _launch(stubs, tmp_path, [(0, 6), (6, 12)], placed=placed) as pipeline:
        first, second = pipeline.stages
        assert first.argv[0].endswith("/env") and first.argv[1] == sys.executable
        assert "--listen" in first.argv and first.argv[first.argv.index("--listen") + 1] == "127.0.0.1:0"
        assert first.address.startswith("127.0.0.1:")
        assert Path(f"/proc/{first.pid}/exe").resolve() == Path(sys.executable).resolve()
        assert [c.info().layer_begin for c in pipeline.clients] == [0, 6]
        pids = pipeline.pids
    assert not any(running(p) for p in pids)
    assert [s.process.returncode for s in pipeline.stages] == [0, 0]


def test_plaintext_beyond_loopback_is_said_only_where_the_host_is_private(stubs, tmp_path: Path) -> None:
    """A stage on a host only this machine reaches (the certifier's namespaces) is started with
    --insecure when it has no TLS; any other stage never is (the real worker then refuses a reachable
    --listen without --tls, worker/src/options.cpp)."""
    placed = [Placed(prefix=("env",), host="127.0.0.1", private=True), Placed()]
    with _launch(stubs, tmp_path, [(0, 6), (6, 12)], placed=placed) as pipeline:
        first, second = pipeline.stages
        assert "--insecure" in first.argv and "--insecure" not in second.argv


def test_a_tls_folder_goes_to_every_stage(tmp_path: Path) -> None:
    cmd = WorkerCommand(program=("w",), model=tmp_path / "m.gguf", tls=tmp_path / "hosts" / "a")
    for k in range(2):
        argv = cmd.argv((0, 1), stage=k)
        assert argv[argv.index("--tls") + 1] == str(tmp_path / "hosts" / "a") and "--insecure" not in argv
    assert "--tls" not in WorkerCommand(program=("w",), model=tmp_path / "m.gguf").argv((0, 1))


def test_placed_must_name_every_stage(stubs, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="2 stages but 1 places"):
        with _launch(stubs, tmp_path, [(0, 6), (6, 12)], placed=[Placed()]):
            pass


_LAUNCH_AND_WAIT = """
import sys, time
from pathlib import Path
from tests.unit.fake_stages import fake_command, fake_env, load_stubs
from worker.launcher import launch

tmp = Path(sys.argv[1])
stubs = load_stubs(tmp / "stubs")
with launch(fake_command(tmp), [(0, 6), (6, 12)], stubs=stubs, evidence=tmp / "evidence",
            env=fake_env(stubs)) as pipeline:
    print(" ".join(str(p) for p in pipeline.pids), flush=True)
    time.sleep(600)
"""


def test_a_launcher_killed_by_sigkill_takes_its_workers_with_it(tmp_path: Path) -> None:
    # No atexit hook or finally runs on SIGKILL; before the launcher pipe the workers (each in a session
    # of its own) served on, orphaned, until someone killed them by hand.
    pids: list[int] = []
    with subprocess.Popen(
        [sys.executable, "-c", _LAUNCH_AND_WAIT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    ) as launcher:
        try:
            pids = [int(p) for p in launcher.stdout.readline().split()]
            assert len(pids) == 2 and all(running(p) for p in pids)
            launcher.kill()
            launcher.wait()
            deadline = time.monotonic() + 60  # generous for a loaded box; stopping is immediate when idle
            while any(running(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(running(p) for p in pids), "a worker outlived its SIGKILLed launcher"
        finally:
            launcher.kill()
            for pid in filter(running, pids):
                os.kill(pid, signal.SIGKILL)
