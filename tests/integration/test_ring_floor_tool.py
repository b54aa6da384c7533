"""dgr-ring-floor (worker/tools/ring_floor.cpp, the bench's floor of a ring on this host) does the work
the workers do: its picks at every depth equal the monolithic worker's greedy tokens from the same
start, its weights sit in memory as the worker's do (the load mode: mapped weights decode 10-18%
slower, which would make a floor above the workers), it reports a speed and each stage's CPU per
pass, ``--deliver`` hands a reader every pick in order, bad usage is a one-line error, exit 2, and a
stage that cannot load ends the run (exit 1, the stage named, no process left behind) instead of
leaving the others waiting on it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from lanes.build import RING_FLOOR_TARGET
from pipeline import drive
from tests.integration.conftest import floor_deliveries, running
from worker.launcher import launch

# One pytest-xdist worker for the whole file: each test checks that no process of the floor binary is
# left anywhere (an orphan is re-parented away from the test), so two floors at once would see each other.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.xdist_group("ring-floor")]

TOKENS = 16


def _left_behind(cpu_build, marker: str) -> dict[int, int]:
    """This run's floor processes still alive, pid to parent pid: the floor's stages are forks of it and
    keep its command line, where ``marker`` (this test's model path or port) is.  Any floor process on
    the machine was the check before, and under pytest-xdist it once counted one that was not this
    test's (a floor of three stages, adopted by a process the test never started)."""
    found = {}
    for pid, ppid in running(cpu_build.dir / "bin" / RING_FLOOR_TARGET).items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone since
        if marker in cmdline:
            found[pid] = ppid
    return found


def _run(cpu_build, model, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    tool = cpu_build.dir / "bin" / RING_FLOOR_TARGET
    return subprocess.run(
        [str(tool), "-m", str(model), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_floor_picks_the_workers_tokens_at_every_depth(
    cpu_build, tiny_model, worker_command, stubs, worker_env, tmp_path
) -> None:
    with launch(worker_command, [(0, 12)], stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        # the floor starts every round from token 1 at position 0 and feeds back its own picks
        wanted = drive.run_placement(p.clients, [[1]], TOKENS).prompts[0].tokens
        load_mode = p.clients[0].info().memory.load_mode
    threads = str(worker_command.threads)
    for stages in (1, 3, 12):
        done = _run(
            cpu_build,
            tiny_model.first,
            "--stages",
            str(stages),
            "--tokens",
            str(TOKENS),
            "--rounds",
            "2",
            "--threads",
            threads,
        )
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got["tokens"] == list(wanted), (stages, got["tokens"], wanted)
        assert got["load_mode"] == load_mode
        assert len(got["tok_s"]) == 2 and all(v > 0 for v in got["tok_s"])
        assert len(got["cpu_us_per_pass"]) == stages and all(v > 0 for v in got["cpu_us_per_pass"])
        # a ring's stages decode one after another, so their llama time per token fits in a token's time
        llama_us = got["decode_us_per_pass"]
        assert len(llama_us) == stages and all(v > 0 for v in llama_us)
        assert sum(llama_us) < sum(1e6 / v for v in got["tok_s"]) / len(got["tok_s"]), got


def test_deliver_hands_every_pick_to_the_reader_in_order(cpu_build, tiny_model) -> None:
    with floor_deliveries(timeout=120) as (port, records):
        done = _run(
            cpu_build,
            tiny_model.first,
            "--stages",
            "3",
            "--tokens",
            str(TOKENS),
            "--rounds",
            "2",
            "--deliver",
            str(port),
        )
    assert done.returncode == 0, done.stderr
    picks = json.loads(done.stdout)["tokens"]
    # {round, position, token}: every position of both rounds, and the last round's tokens are the picks
    assert [(r, p) for r, p, _ in records] == [(r, p) for r in range(2) for p in range(TOKENS)]
    assert [t for r, _, t in records if r == 1] == picks
    assert [t for r, _, t in records if r == 0] == picks  # every round starts afresh from token 1


def test_deliver_to_no_listener_ends_the_run(cpu_build, tiny_model) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    done = _run(
        cpu_build,
        tiny_model.first,
        "--stages",
        "2",
        "--rounds",
        "1",
        "--tokens",
        "4",
        "--deliver",
        str(port),
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"--deliver {port}:" in done.stderr
    assert "ended before it was ready" in done.stderr.splitlines()[-1]
    assert _left_behind(cpu_build, f"--deliver {port} ") == {}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--stages", "0"], "--stages: not a count: 0"),
        (["--stages", "13"], "13 stages for a model of 12 layers"),
        (["--tokens", "600"], "--tokens must be below --ctx"),
        (["--bogus", "1"], "unknown option --bogus"),
        (["--deliver", "70000"], "--deliver: not a port: 70000"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(cpu_build, tiny_model, args, said) -> None:
    done = _run(cpu_build, tiny_model.first, *args)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr.splitlines()[0]


def test_a_stage_that_cannot_load_ends_the_run(cpu_build, tiny_model, tmp_path) -> None:
    # the first file of the split alone: its header names 12 layers, its tensors are in the other files
    alone = tmp_path / tiny_model.first.name
    shutil.copyfile(tiny_model.first, alone)
    done = _run(cpu_build, alone, "--stages", "3", "--rounds", "1", "--tokens", "4", timeout=120)
    assert done.returncode == 1, done.stderr
    assert "cannot load layers" in done.stderr
    assert "ended before it was ready" in done.stderr.splitlines()[-1]
    # a stage left behind would be the init process's child by now, not this test's
    assert _left_behind(cpu_build, str(alone)) == {}
