"""A line the slow suite prints before its tests (the CPU lane's build time) reaches the run's output
under pytest-xdist too, where a worker's own terminal is never shown (issue 39)."""

from __future__ import annotations

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


def test_only_the_slow_suites_second_worker_is_niced(pytester: pytest.Pytester, monkeypatch) -> None:
    """Beside two busy loops the fast suite's niced worker got so little of the cores that a 60 s wait
    in one of its tests ran out (the busy run on 18de092): only `-m slow` nices its second worker."""
    from tests.integration.conftest import selects_slow

    assert selects_slow("slow") and selects_slow("slow and quick")
    assert not selects_slow("not slow") and not selects_slow("")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("from tests.integration.conftest import pytest_configure\n")
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
    for marks, niced in (("not slow", False), ("slow", True)):
        seen_file = pytester.path / f"seen-{niced}"
        monkeypatch.setenv("SEEN", str(seen_file))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-m", marks)
        assert result.ret == 0, result.stdout.str()
        seen = {tuple(line.split()) for line in seen_file.read_text().splitlines()}
        assert seen == ({("gw0", "0"), ("gw1", "19")} if niced else {("gw0", "0"), ("gw1", "0")})
