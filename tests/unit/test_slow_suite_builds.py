"""The slow suite builds the CPU lane after collection, outside every test's timeout.

A cold build on two cores takes longer than the 600 s a test may run: built inside the first test's
``cpu_build`` fixture, it timed out there, and the cached fixture error failed every test after it.
Here a stand-in build that takes longer than the test's timeout must leave the test passing.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import tests.integration.conftest  # noqa: F401  (imported once here: pytester's inner runs reuse it)

pytest_plugins = ["pytester"]

USES_THE_LANE = """
def test_uses_the_lane(cpu_build):
    assert cpu_build.worker.is_file()
"""


def test_a_build_longer_than_a_test_may_run_is_made_before_the_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lanes.build

    worker = tmp_path / "dgr-shard-worker"
    worker.write_text("")
    builds: list[str] = []

    def slow_build(ctx, lane):
        builds.append(lane)
        time.sleep(2.0)
        return SimpleNamespace(worker=worker)

    monkeypatch.setattr(lanes.build, "ensure_build", slow_build)
    pytester.makeconftest("from tests.integration.conftest import *  # noqa: F403\n")
    pytester.makepyfile(test_lane=USES_THE_LANE)
    result = pytester.runpytest_inprocess("--timeout=1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert builds == ["cpu"]
    result.stdout.fnmatch_lines(["CPU lane ready before the tests: * s"])


def test_a_failed_build_is_the_error_of_the_test_that_needs_the_lane(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lanes.build

    def broken_build(ctx, lane):
        raise RuntimeError("the compiler crashed")

    monkeypatch.setattr(lanes.build, "ensure_build", broken_build)
    pytester.makeconftest("from tests.integration.conftest import *  # noqa: F403\n")
    pytester.makepyfile(test_lane=USES_THE_LANE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: the compiler crashed*"])
