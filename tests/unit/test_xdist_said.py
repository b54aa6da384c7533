"""A line the slow suite prints before its tests (the CPU lane's build time) reaches the run's output
under pytest-xdist too, where a worker's own terminal is never shown (issue 39)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> list[str]:
    """Two empty tests under a conftest that says one line after collection, as the slow suite's does."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(
        "from tests.integration.conftest import pytest_terminal_summary, pytest_testnodedown, say\n"
        "\n"
        "def pytest_collection_finish(session):\n"
        "    say(session.config, 'ready before the tests: 7 s')\n"
    )
    pytester.makepyfile("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str()
    return result.stdout.lines


def test_each_workers_line_is_in_the_summary(pytester: pytest.Pytester, monkeypatch) -> None:
    lines = _run(pytester, monkeypatch, "-n", "2")
    assert "gw0: ready before the tests: 7 s" in lines and "gw1: ready before the tests: 7 s" in lines


def test_without_xdist_the_line_is_printed_as_it_happens(pytester: pytest.Pytester, monkeypatch) -> None:
    assert _run(pytester, monkeypatch).count("ready before the tests: 7 s") == 1


def test_both_workers_of_either_suite_run_at_the_suites_own_priority(
    pytester: pytest.Pytester, monkeypatch
) -> None:
    """No worker is niced.  The slow suite's second worker once ran at nice 19 on a quiet machine; beside
    the first worker's certifications (a few workers each, on both cores) it got so little CPU that a
    one-stage Forward of its own missed a 60 s deadline (test_worker_sigterm, the quiet run on a6763a0),
    as it had beside two busy loops (18de092, 37f0fda), and the wall time it was meant to save was
    within the runs' noise (docs/measurements/issue-39: efa72da against 26e9eea)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(
        "import tests.integration.conftest as slow_suite\n"
        "slow_suite._procs_running = lambda: 1  # a quiet machine, as the run on a6763a0 found it\n"
        "from tests.integration.conftest import *  # noqa: F403  every hook the slow suite has\n"
    )
    record = (
        "    with open(os.environ['SEEN'], 'a') as f:\n"
        "        f.write(f\"{os.environ['PYTEST_XDIST_WORKER']} {os.nice(0)}\\n\")\n"
    )
    pytester.makepyfile(
        "import os, pytest\n"
        "@pytest.mark.slow\n"
        "@pytest.mark.parametrize('k', range(8))\n"
        "def test_slow(k):\n" + record + "@pytest.mark.parametrize('k', range(8))\n"
        "def test_fast(k):\n" + record
    )
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    base = str(os.nice(0))  # what this test runs at (a suite run at nice 10 passes it down)
    for marks in ("not slow", "slow"):
        seen_file = pytester.path / f"seen-{marks}"
        monkeypatch.setenv("SEEN", str(seen_file))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-m", marks)
        assert result.ret == 0, result.stdout.str()
        seen = {tuple(line.split()) for line in seen_file.read_text().splitlines()}
        assert seen == {("gw0", base), ("gw1", base)}, marks


def test_the_tests_of_one_shared_run_share_one_worker(pytester: pytest.Pytester, monkeypatch) -> None:
    """A module fixture read by several tests (test_certify_e2e's tight_run) is made once under two
    workers: its tests go to one xdist group.  Two workers each made it once, and one's teardown removed
    the recipe's report folder the other was reading (the quiet run on 2a79702)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    made = pytester.path / "made"
    made.mkdir()
    pytester.makeconftest("from tests.integration.conftest import pytest_collection_modifyitems\n")
    tests = "\n".join(
        f"def test_reads_{i}(tight_run):\n    pass\n\ndef test_other_{i}():\n    pass\n" for i in range(6)
    )
    pytester.makepyfile(
        "import os, pytest\n"
        "\n"
        "@pytest.fixture(scope='module')\n"
        "def tight_run():\n"
        f"    open(os.path.join({str(made)!r}, os.environ.get('PYTEST_XDIST_WORKER', 'main')), 'w').close()\n"
        "\n" + tests
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup")
    assert result.ret == 0, result.stdout.str()
    assert len(list(made.iterdir())) == 1, sorted(p.name for p in made.iterdir())
