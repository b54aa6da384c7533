"""tests/durations.py: the summary CI prints at the end of every run (issue 39)."""

from __future__ import annotations

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
