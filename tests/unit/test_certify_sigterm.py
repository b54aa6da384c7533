"""SIGTERM to a running certification (a CI job cancelled, an operator's `kill`): every worker is
stopped, nothing is signed, and the process exits 143 (RELIABILITY 20: no worker left behind)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from core.workspace import PROJECT_ROOT
from tests.unit.fake_stages import running

CHILD = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    from cli import main as cli
    from tests.unit.certify_fixtures import certify_fake, fake_context

    signal.signal(signal.SIGTERM, cli._terminate)  # what `dgr` installs in main()
    root = Path(sys.argv[1])
    ctx = fake_context(root, DGR_FAKE_FAULT="hang-forward", DGR_FAKE_FAULT_BEGIN="6")
    try:
        certify_fake(root, ctx=ctx, call_deadline=120.0)
    except cli.Terminated:
        sys.exit(143)
    sys.exit(0)
    """
)


def _workers_of(tmp_path: Path) -> dict[int, str]:
    """Live processes whose command line names this test's model: our fake workers (pid -> layers)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "--layers" in args and any(os.fspath(tmp_path) in a for a in args):
            found[int(entry.name)] = args[args.index("--layers") + 1]
    return found


def _staged_workers(child: subprocess.Popen[bytes], tmp_path: Path) -> dict[int, str]:
    """The workers once the staged placement whose second stage hangs in Forward is up.  Up to 180 s:
    beside two busy loops the fake certification took over 60 s to get there (the busy run on 18de092)."""
    deadline = time.monotonic() + 180
    workers: dict[int, str] = {}
    while time.monotonic() < deadline and child.poll() is None:
        workers = _workers_of(tmp_path)
        if "6:12" in workers.values():
            break
        time.sleep(0.2)
    assert child.poll() is None, "the certification ended before it could be interrupted"
    assert "6:12" in workers.values(), f"the staged workers never came up: {workers}"
    return workers


def test_sigterm_stops_every_worker_and_signs_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.fspath(PROJECT_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, os.fspath(tmp_path)], env=env)
    try:
        workers = _staged_workers(child, tmp_path)
        time.sleep(1.0)  # let the driver block inside the hung Forward
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 143
    finally:  # a failed wait must not leave the certification running into the next test
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not any(running(p) for p in workers)
    assert not _workers_of(tmp_path)
    assert not list((tmp_path / "work" / "reports").rglob("certificate.json"))
    # The evidence says how the run ended (issue 20 item 15), as it does for a DgrError.
    (run_json,) = (tmp_path / "work" / "runs").glob("*/run.json")
    record = json.loads(run_json.read_text())
    assert record["status"] == "ERROR" and record["error"] == "terminated by SIGTERM before the run finished"
