"""The test command's closing summary: wall time per suite and the slowest tests across both.

``python -m tests.durations RESULT.xml ...`` reads the JUnit XML files pytest wrote (``--junitxml``)
and prints each suite's wall time, its summed test time and the ten slowest tests (setup, call and
teardown together, so a session fixture's cost, such as a lane build, shows on the first test that
asked for it).
Standard library only: `.ci/run` and the `tests` session run it whatever is installed.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Timed:
    suite: str  # the XML file's stem: fast, slow
    test: str  # pytest's node id, as -k and --durations name it
    seconds: float
    worker: str = ""  # the pytest-xdist worker that ran it ("main" without xdist; "" if not recorded)
    started: float = 0.0  # epoch seconds: its setup began (tests/conftest.py records both)
    ended: float = 0.0  # its teardown ended


def read(path: Path) -> list[Timed]:
    """Every test case of one JUnit file (skipped ones too: their setup may have cost time)."""
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        said = {p.get("name"): p.get("value", "") for p in case.iter("property")}
        cases.append(
            Timed(
                suite=path.stem,
                test=f"{module}.py::{case.get('name', '?')}",
                seconds=float(case.get("time", "0") or 0),
                worker=said.get("worker", ""),
                started=float(said.get("started") or 0),
                ended=float(said.get("ended") or 0),
            )
        )
    return cases


def workers(cases: list[Timed]) -> list[str]:
    """Per suite and worker: its tests, the seconds it spent in them and the seconds it waited while
    the suite's tests ran, at the end (nothing left for it) and between tests.  A worker idle at the
    end while another still runs is wall a better order could win."""
    lines = []
    for suite in dict.fromkeys(c.suite for c in cases):
        mine = [c for c in cases if c.suite == suite and c.worker and c.ended >= c.started > 0]
        if not mine:
            continue
        first, last = min(c.started for c in mine), max(c.ended for c in mine)
        for worker in sorted({c.worker for c in mine}):
            ran = [c for c in mine if c.worker == worker]
            busy = sum(c.ended - c.started for c in ran)
            tail = last - max(c.ended for c in ran)
            idle = (last - first) - busy
            lines.append(
                f"  {suite} {worker}: {len(ran)} tests in {busy:.0f} s of the suite's {last - first:.0f} s;"
                f" idle {idle:.0f} s, {tail:.0f} s of it after its last test"
            )
    return lines


def wall_seconds(path: Path) -> float | None:
    """The suite's wall time as pytest wrote it (the testsuite element's ``time``: the whole session,
    pytest-xdist's workers side by side, so less than the summed test time when they overlap)."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    raw = suite.get("time") if suite is not None else None
    return float(raw) if raw else None


def summary(cases: list[Timed], slowest: int, walls: dict[str, float | None] | None = None) -> list[str]:
    lines = []
    for suite in dict.fromkeys(c.suite for c in cases):
        mine = [c for c in cases if c.suite == suite]
        wall = (walls or {}).get(suite)
        took = f"{wall:.0f} s wall, " if wall is not None else ""
        summed = sum(c.seconds for c in mine)
        lines.append(f"suite {suite}: {len(mine)} tests, {took}{summed:.0f} s of test time")
    lines.append(f"the {slowest} slowest tests:")
    for c in sorted(cases, key=lambda c: c.seconds, reverse=True)[:slowest]:
        lines.append(f"  {c.seconds:8.1f} s  {c.suite:4}  {c.test}")
    spent = workers(cases)
    if spent:
        lines.append("where each worker's time went (from its first test to the suite's last):")
        lines.extend(spent)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="JUnit XML files pytest wrote")
    parser.add_argument("--slowest", type=int, default=10)
    args = parser.parse_args(argv)
    cases = [c for path in args.results if path.is_file() for c in read(path)]
    if not cases:
        print("tests.durations: no test results in " + ", ".join(map(str, args.results)), file=sys.stderr)
        return 1
    walls = {path.stem: wall_seconds(path) for path in args.results if path.is_file()}
    print("\n".join(summary(cases, args.slowest, walls)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
