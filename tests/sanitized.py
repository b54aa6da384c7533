"""`nox -s sanitize`: the worker's tests against a CPU lane built with AddressSanitizer and UBSan.

``python -m tests.sanitized [PYTEST ARGS]`` sets ``DGR_SANITIZE=address,undefined`` (the lane builds
under a key of its own: lanes/base.BuildOptions), has every sanitizer report written to a file of its
own under the workspace's ``sanitize/`` (``DGR_WORK``, ``.work`` by default) instead of a worker's
stderr, runs the slow tests that start real workers (WORKER_TESTS, or the pytest arguments given), then
counts the reports: each is named with its first lines and any report fails the session (exit 1), as a
failed test does.  A process that finds nothing writes no file, so an empty folder is the finding
"0 reports", not a missing one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from core.workspace import PROJECT_ROOT, Workspace

# The tests that start real workers and drive every way a pass reaches one: each stage's checks,
# weights, threads, CPUs and shutdown, relayed, chained and ring passes, layer captures, the fuzz
# corpus's recording and the Session RPC.
WORKER_TESTS = (
    "tests/integration/test_worker_validation.py",
    "tests/integration/test_worker_errors.py",
    "tests/integration/test_worker_weights.py",
    "tests/integration/test_worker_threads.py",
    "tests/integration/test_worker_cpus.py",
    "tests/integration/test_worker_sigterm.py",
    "tests/integration/test_worker_session.py",
    "tests/integration/test_worker_tls.py",  # TLS on the gRPC port, the pass ports, the deliveries
    "tests/integration/test_worker_tls_ports.py",
    "tests/integration/test_mac_frames.py",  # authenticated frames on the pass ports, and hostile ones
    "tests/integration/test_ring.py",
    "tests/integration/test_chained.py",
    "tests/integration/test_staged_parity.py",
    "tests/integration/test_fuzz_corpus.py",
)


def sanitizer_env(reports: Path) -> dict[str, str]:
    """Each process writes its reports to ``reports``/<tool>.<pid>; leaks count; UBSan's with a stack."""
    return {
        "DGR_SANITIZE": "address,undefined",
        "ASAN_OPTIONS": f"log_path={reports}/asan:detect_leaks=1:halt_on_error=1",
        "UBSAN_OPTIONS": f"log_path={reports}/ubsan:print_stacktrace=1:halt_on_error=1",
        "LSAN_OPTIONS": f"log_path={reports}/lsan",
    }


def reports_folder(env: Mapping[str, str]) -> Path:
    """Where the reports go: beside the sanitized lane's build, in the workspace DGR_WORK names."""
    return Workspace.from_env(env).root / "sanitize"


def reports_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def main(argv: list[str]) -> int:
    reports = reports_folder(os.environ)
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    env = {**os.environ, **sanitizer_env(reports)}
    tests = argv or list(WORKER_TESTS)
    pytest = [sys.executable, "-m", "pytest", "-m", "slow", "-p", "no:cacheprovider", *tests]
    code = subprocess.run(pytest, cwd=PROJECT_ROOT, env=env, check=False).returncode
    found = reports_in(reports)
    for report in found:
        head = "\n    ".join(report.read_text(errors="replace").splitlines()[:12])
        print(f"sanitizer report {report}:\n    {head}", flush=True)
    print(f"sanitize: {len(found)} sanitizer report(s) under {reports}; pytest exited {code}", flush=True)
    return 1 if found or code else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
