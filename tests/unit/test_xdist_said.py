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
