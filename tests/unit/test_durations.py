"""tests/durations.py: the summary CI prints at the end of every run (issue 39)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests import durations

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="0" tests="3" time="{wall}">
<testcase classname="tests.unit.test_a" name="test_quick" time="0.5"/>
<testcase classname="tests.unit.test_a" name="test_slow[2]" time="40.5"/>
<testcase classname="tests.integration.test_b" name="test_mid" time="7.0"/>
</testsuite></testsuites>
"""


def test_each_suite_has_its_wall_time_and_the_slowest_come_first(tmp_path: Path, capsys) -> None:
    fast = tmp_path / "fast.xml"
    fast.write_text(XML.format(wall="31.9"))
    assert durations.main([str(fast), str(tmp_path / "slow.xml"), "--slowest", "2"]) == 0  # slow: not run
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "suite fast: 3 tests, 32 s wall, 48 s of test time"
    assert out[1] == "the 2 slowest tests:"
    assert out[2].split() == ["40.5", "s", "fast", "tests/unit/test_a.py::test_slow[2]"]
    assert out[3].split() == ["7.0", "s", "fast", "tests/integration/test_b.py::test_mid"]
    assert len(out) == 4


def test_no_results_is_exit_1(tmp_path: Path, capsys) -> None:
    assert durations.main([str(tmp_path / "none.xml")]) == 1
    assert "no test results" in capsys.readouterr().err


TIMED = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3" time="100">
<testcase classname="tests.integration.test_a" name="test_one" time="60"><properties>
<property name="started" value="1000.000"/><property name="ended" value="1060.000"/>
<property name="worker" value="gw0"/></properties></testcase>
<testcase classname="tests.integration.test_a" name="test_two" time="30"><properties>
<property name="started" value="1000.000"/><property name="ended" value="1030.000"/>
<property name="worker" value="gw1"/></properties></testcase>
<testcase classname="tests.integration.test_a" name="test_three" time="10"><properties>
<property name="started" value="1040.000"/><property name="ended" value="1050.000"/>
<property name="worker" value="gw1"/></properties></testcase>
</testsuite></testsuites>
"""


def test_each_workers_busy_and_idle_time_comes_from_the_recorded_start_and_end(
    tmp_path: Path, capsys
) -> None:
    slow = tmp_path / "slow.xml"
    slow.write_text(TIMED)
    assert durations.main([str(slow), "--slowest", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3] == "where each worker's time went (from its first test to the suite's last):"
    assert (
        out[-2] == "  slow gw0: 1 tests in 60 s of the suite's 60 s; idle 0 s, 0 s of it after its last test"
    )
    assert (
        out[-1]
        == "  slow gw1: 2 tests in 40 s of the suite's 60 s; idle 20 s, 10 s of it after its last test"
    )


def test_a_real_run_records_when_each_test_ran_and_where(tmp_path: Path) -> None:
    """tests/conftest.py's hook, through a real pytest run of one fast test and its JUnit file."""
    junit = tmp_path / "one.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "tests/unit/test_metrics.py::test_top1_agreement",
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTEST_XDIST_WORKER": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (case,) = durations.read(junit)
    assert case.worker == "main" and 0 < case.ended - case.started < 60
    assert abs(case.started - time.time()) < 300
