"""Authenticated frames on the real worker's pass ports (issue 43, ``--pass-frames mac``), the CPU lane
and the embedded tiny model.

- staged == monolithic bit for bit with every pass port in authenticated frames, streamed ring and
  chained, at 2, 4 and 12 stages, and each stage's log says its connections ran them;
- a client offering authenticated frames without a certificate, with one of another CA, or with an
  expired one is closed in the handshake, as on TLS records;
- on a connection that did run them (``dgr-pass-probe``, keyed from the same handshake): a frame
  replayed, a frame altered after tagging and two frames in the wrong order are refused, the
  connection is closed and none of those frames reaches the stage;
- a stage that allows them beside one that does not runs TLS records on that seam.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lanes.build import PASS_PROBE_TARGET
from pipeline import drive, routes
from tests.tls_helpers import untrusted_clients
from worker import tls, tls_ca
from worker.launcher import Pipeline, WorkerCommand, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

N_LAYER = 12
N_DECODE = 8
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time"]
PLACEMENTS = {
    "2-stages": [(0, 6), (6, 12)],
    "4-stages": [(0, 3), (3, 6), (6, 9), (9, 12)],
    "12-stages": [(k, k + 1) for k in range(N_LAYER)],
}
ROUTES = {"ring-streamed": routes.Ring(), "chained": routes.Chained()}
REACHED = "dropped a message that is not a streamed ring's pass"  # the stage's word for a pass it read
IN_MAC_FRAMES = "pass port: a connection in authenticated frames"
FORGED = "pass port: a frame that does not authenticate"
ALPN = "dgr-mac-frames/1"


@pytest.fixture(scope="module")
def mac(worker_command: WorkerCommand, ca: Path) -> WorkerCommand:
    driver = tls.load(ca / tls_ca.HOSTS / "driver")
    worker = ca / tls_ca.HOSTS / "worker"
    return dataclasses.replace(worker_command, tls=worker, driver_tls=driver, pass_frames="mac")


@pytest.fixture(scope="module")
def staged(mac: WorkerCommand, stubs, worker_env, tmp_path_factory) -> Iterator[Pipeline]:
    evidence = tmp_path_factory.mktemp("staged-mac")
    with launch(mac, [(0, 6), (6, 12)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        yield p


def _log(p: Pipeline, stage: int) -> str:
    return p.stages[stage].stderr_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def mono(mac: WorkerCommand, stubs, worker_env, tmp_path_factory) -> tuple[list, drive.Trace]:
    """The prompts and the monolithic worker's run of them, once for every placement."""
    evidence = tmp_path_factory.mktemp("mono-mac")
    with launch(mac, [(0, N_LAYER)], stubs=stubs, evidence=evidence, env=worker_env) as p:
        prompts = [p.clients[0].tokenize(text, add_special=True) for text in TEXTS]
        return prompts, drive.run_placement(p.clients, prompts, N_DECODE)


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_staged_equals_monolithic_in_authenticated_frames(
    name: str, mono, mac: WorkerCommand, stubs, worker_env, tmp_path: Path
) -> None:
    prompts, reference = mono
    placement = PLACEMENTS[name]
    with launch(mac, placement, stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        assert {c.info().pass_frames for c in p.clients} == {"mac"}
        for route_name, route in ROUTES.items():
            got = drive.run_placement(p.clients, prompts, N_DECODE, route=route)
            for g, m in zip(got.prompts, reference.prompts, strict=True):
                assert g.tokens == m.tokens, (name, route_name)
                assert np.array_equal(g.logits, m.logits), (name, route_name)
        for k in range(len(placement)):  # every stage took its neighbour's passes in authenticated frames
            assert IN_MAC_FRAMES in _log(p, k), (name, k)
            assert FORGED not in _log(p, k), (name, k)


def _refused_in_handshake(port: int, context: ssl.SSLContext) -> bool:
    context.set_alpn_protocols([ALPN])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.settimeout(5)
                return s.recv(1) == b""  # TLS 1.3: the client's certificate is judged after its Finished
    except (OSError, ssl.SSLError):
        return True


def test_clients_without_a_trusted_certificate_are_refused(
    staged: Pipeline, ca: Path, tmp_path: Path
) -> None:
    port = staged.clients[1].info().pass_port
    hostile = untrusted_clients(ca, tmp_path)
    before = _log(staged, 1).count("pass port: closed a connection: TLS handshake")
    for what, context in hostile.items():
        assert _refused_in_handshake(port, context), what
    time.sleep(0.5)
    assert _log(staged, 1).count("pass port: closed a connection: TLS handshake") == before + len(hostile)


def _probe(cpu_build, ca: Path, port: int, frame: Path, then: str) -> str:
    argv = [
        os.fspath(cpu_build.dir / "bin" / PASS_PROBE_TARGET),
        *("--tls", os.fspath(ca / tls_ca.HOSTS / "driver"), "--port", str(port)),
        *("--frame", os.fspath(frame), "--then", then),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _wait_for(predicate, timeout: float = 20.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until and not predicate():
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize(
    ("then", "reaching", "closed"),
    [
        ("none", 1, False),  # the probe's own frame, as the connection sends it: the control
        ("replay", 1, True),  # the first copy reaches the stage, the replayed one does not
        ("tamper", 0, True),
        ("reorder", 0, True),
    ],
)
def test_frames_replayed_altered_or_reordered_are_refused(
    then: str, reaching: int, closed: bool, staged: Pipeline, ca: Path, stubs, cpu_build, tmp_path: Path
) -> None:
    frame = tmp_path / "frame.bin"  # a pass the stage reads and drops (no Ring.stream): proof it got through
    frame.write_bytes(
        stubs.pb2.ForwardRequest(session_id="probe", epoch=1, positions=[0], tokens=[1]).SerializeToString()
    )
    reached, forged = _log(staged, 1).count(REACHED), _log(staged, 1).count(FORGED)
    said = _probe(cpu_build, ca, staged.clients[1].info().pass_port, frame, then)
    assert said == ("closed" if closed else "open"), then
    assert _wait_for(lambda: _log(staged, 1).count(REACHED) == reached + reaching), then
    time.sleep(0.5)
    assert _log(staged, 1).count(REACHED) == reached + reaching, then
    assert _log(staged, 1).count(FORGED) == forged + (1 if closed else 0), then


def test_a_seam_with_one_end_on_tls_records_runs_tls_records(
    mac: WorkerCommand, ca: Path, stubs, cpu_build, worker_env, tmp_path: Path
) -> None:
    records = dataclasses.replace(mac, pass_frames="tls")
    with launch(records, [(0, N_LAYER)], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        assert p.clients[0].info().pass_frames == "tls"
        probe = [
            os.fspath(cpu_build.dir / "bin" / PASS_PROBE_TARGET),
            "--tls",
            os.fspath(ca / tls_ca.HOSTS / "driver"),
        ]
        frame = tmp_path / "frame.bin"
        frame.write_bytes(b"\x00")
        port = str(p.clients[0].info().pass_port)
        done = subprocess.run(
            [*probe, "--port", port, "--frame", os.fspath(frame), "--then", "none"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 3 and "chose TLS records" in done.stderr, done.stderr
        prompt = p.clients[0].tokenize(TEXTS[0], add_special=True)
        assert drive.run_placement(p.clients, [prompt], N_DECODE, route=routes.Ring()).prompts[0].tokens
        assert IN_MAC_FRAMES not in _log(p, 0)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--pass-frames", "mac"], "--pass-frames mac needs --tls DIR"),
        (["--pass-frames", "aes"], "--pass-frames: tls or mac, got 'aes'"),
    ],
)
def test_pass_frames_usage_errors_are_exit_2(
    flags: list[str], said: str, worker_command: WorkerCommand
) -> None:
    argv = [*worker_command.argv((0, N_LAYER)), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and said in done.stderr, done.stderr
