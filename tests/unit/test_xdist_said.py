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


def test_only_the_slow_suites_second_worker_on_a_quiet_machine_is_niced(
    pytester: pytest.Pytester, monkeypatch
) -> None:
    """Beside two busy loops a niced worker got so little of the cores that its tests' waits ran out
    (the busy runs on 18de092, fast suite, and 37f0fda, slow suite): only `-m slow` nices its second
    worker, and only when no other process keeps the cores busy at its start (/proc/stat's
    procs_running, faked here: FAKE_RUNNING counts this worker too)."""
    from tests.integration.conftest import selects_slow

    assert selects_slow("slow") and selects_slow("slow and quick")
    assert not selects_slow("not slow") and not selects_slow("")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(
        "import os\n"
        "import tests.integration.conftest as slow_suite\n"
        "slow_suite._procs_running = lambda: int(os.environ['FAKE_RUNNING'])\n"
        "from tests.integration.conftest import pytest_configure, pytest_terminal_summary\n"
        "from tests.integration.conftest import pytest_testnodedown\n"
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
    for marks, running, niced in (("not slow", 1, False), ("slow", 2, True), ("slow", 4, False)):
        seen_file = pytester.path / f"seen-{marks}-{running}"
        monkeypatch.setenv("SEEN", str(seen_file))
        monkeypatch.setenv("FAKE_RUNNING", str(running))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-m", marks)
        assert result.ret == 0, result.stdout.str()
        seen = {tuple(line.split()) for line in seen_file.read_text().splitlines()}
        base = str(os.nice(0))  # what this test runs at (a suite run at nice 10 passes it down)
        assert seen == ({("gw0", base), ("gw1", "19")} if niced else {("gw0", base), ("gw1", base)}), marks
        if marks == "slow":
            said = "at nice 19: 1 other" if niced else "not niced: 3 other"
            line = f"gw1: second worker {said} runnable at start"
            assert line in result.stdout.lines, result.stdout.str()


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
