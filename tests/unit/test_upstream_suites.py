"""lanes.upstream_suites: test-llama-archs' table parsed, pristine vs patched compared, the report written.

Fake outcomes and real cheap processes (``sys.executable -c``); the real builds and runs are in
tests/integration/test_upstream_suites.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lanes import upstream_suites as us
from lanes.upstream_suites import Outcome, Status, Suite

# test-llama-archs' own output: colours, padding, a header and a separator.
ARCHS_OUT = """\
main: some log line
|  Model arch.|Device|Config|   NMSE vs. CPU|Roundtrip|
|-------------|------|------|---------------|---------|
|        llama|   CPU| Dense|\x1b[1;32mOK\x1b[0m (1.23e-07)|\x1b[1;32mOK\x1b[0m|
|        llama|  Meta| Dense|\x1b[1;33mSKIP\x1b[0m            |\x1b[1;33mSKIP\x1b[0m|
|      qwen3moe|   CPU|   MoE|\x1b[1;32mOK\x1b[0m (4.00e-08)|\x1b[1;32mOK\x1b[0m|
"""


def _archs(output: str) -> tuple[str, ...]:
    return us.archs_rows(output)


def test_archs_rows_strip_colours_and_header() -> None:
    rows = _archs(ARCHS_OUT)
    assert rows == (
        "llama|CPU|Dense|OK (1.23e-07)|OK",
        "llama|Meta|Dense|SKIP|SKIP",
        "qwen3moe|CPU|MoE|OK (4.00e-08)|OK",
    )
    assert us.row_counts(rows) == {"rows": 3, "OK": 2, "FAIL": 0, "SKIP": 1, "archs": 2}


def test_same_verdicts_with_other_nmse_digits_are_not_a_difference() -> None:
    a = _archs(ARCHS_OUT)
    b = _archs(ARCHS_OUT.replace("1.23e-07", "1.24e-07"))
    assert us.worse_rows(a, b) == []


def test_a_row_that_fails_or_vanishes_on_the_patched_tree_is_a_regression() -> None:
    a = _archs(ARCHS_OUT)
    meta = "|        llama|  Meta"
    failed = _archs(ARCHS_OUT.replace(f"\x1b[1;32mOK\x1b[0m|\n{meta}", f"\x1b[1;31mFAIL\x1b[0m|\n{meta}"))
    assert us.worse_rows(a, failed) == ["llama|CPU|Dense"]
    assert us.worse_rows(a, a[:2]) == ["qwen3moe|CPU|MoE"]
    suite = Suite(name="archs", target="test-llama-archs", archs_table=True)
    rows = us.compare(
        [suite],
        {"archs": Outcome(status=Status.PASS, rows=a)},
        {"archs": Outcome(status=Status.PASS, rows=failed)},
    )
    assert rows[0].regression  # both exited 0, yet a row got worse
    assert "rows differing: llama|CPU|Dense" in rows[0].notes


def test_regression_only_when_the_pristine_tree_passes() -> None:
    suite = Suite(name="t", target="t")

    def row(a: Status, b: Status) -> us.Row:
        return us.compare([suite], {"t": Outcome(status=a)}, {"t": Outcome(status=b)})[0]

    assert row(Status.PASS, Status.FAIL).regression
    assert row(Status.PASS, Status.TIMEOUT).regression
    assert row(Status.PASS, Status.NOT_BUILT).regression
    assert not row(Status.FAIL, Status.FAIL).regression  # upstream's own failure, not ours
    assert not row(Status.PASS, Status.PASS).regression
    assert not row(Status.FAIL, Status.PASS).regression


def test_report_table_and_json(tmp_path: Path) -> None:
    suites = [Suite(name="test-a", target="a", note="n"), Suite(name="test-b", target="b")]
    rows = us.compare(
        suites,
        {"test-a": Outcome(status=Status.PASS, seconds=1.5), "test-b": Outcome(status=Status.PASS)},
        {
            "test-a": Outcome(status=Status.PASS, seconds=1.25),
            "test-b": Outcome(status=Status.FAIL, detail="boom"),
        },
    )
    report = us.write_report(
        tmp_path, rows, {"commit": "c" * 40, "changed_dirs": ["include", "src"], "ggml_unchanged": True}
    )
    assert report.regressions == ("test-b",) and not report.ok
    md = report.markdown_path.read_text()
    assert "| test-a | PASS | PASS | 1.5 / 1.2 | n |" in md
    assert "| test-b | PASS | FAIL |" in md and "FAILS ONLY ON THE PATCHED TREE" in md
    assert "Tests failing only on the patched tree: 1 (test-b)" in md
    data = us.load(report.json_path)
    assert data["regressions"] == ["test-b"]
    assert data["suites"][1]["patched"]["status"] == "FAIL"


def test_run_one_real_processes(tmp_path: Path) -> None:
    script = tmp_path / "t"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint(sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    script.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin"}

    def run(*args: str, timeout_s: float = 30.0) -> Outcome:
        suite = Suite(name=f"t {' '.join(args)}", target="t", args=args, timeout_s=timeout_s)
        return us.run_one(
            suite,
            script,
            tree=tmp_path,
            models={"tiny": tmp_path / "m.gguf"},
            logs=tmp_path / "logs",
            env=env,
        )

    assert run("0", "{tiny}").status is Status.PASS
    failed = run("3", "{tree}")
    assert failed.status is Status.FAIL and failed.returncode == 3 and str(tmp_path) in failed.detail
    assert run("0", "{gen:nope}").status is Status.NOT_RUN
    missing = us.run_one(
        Suite(name="x", target="x"),
        tmp_path / "absent",
        tree=tmp_path,
        models={},
        logs=tmp_path / "logs",
        env=env,
    )
    assert missing.status is Status.NOT_BUILT
    sleeper = tmp_path / "s"
    sleeper.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    sleeper.chmod(0o755)
    slow = us.run_one(
        Suite(name="s", target="s", timeout_s=0.5),
        sleeper,
        tree=tmp_path,
        models={},
        logs=tmp_path / "logs",
        env=env,
    )
    assert slow.status is Status.TIMEOUT


def test_every_suite_target_is_an_upstream_test_and_names_are_unique() -> None:
    names = [s.name for s in us.SUITES]
    assert len(names) == len(set(names))
    assert "test-llama-archs" in us.targets() and "test-gguf" in us.targets()
    archs = next(s for s in us.SUITES if s.archs_table)
    assert archs.args == ("-s", "1234")
    json.dumps(us.NOT_RUN)


def test_changed_dirs_names_changed_and_added_files(tmp_path: Path) -> None:
    a, b = tmp_path / "pristine", tmp_path / "patched"
    for root in (a, b):
        for rel in ("ggml/g.c", "src/s.cpp", "include/llama.h"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("same\n")
    (b / "src/s.cpp").write_text("changed\n")
    (b / "tests").mkdir()
    (b / "tests/test-new.cpp").write_text("new\n")
    assert us.changed_dirs(a, b) == ["src", "tests"]


def test_the_stacks_architectures_are_named_in_the_notes() -> None:
    rows = _archs(ARCHS_OUT)
    suite = Suite(name="archs", target="test-llama-archs", archs_table=True)
    [row] = us.compare(
        [suite],
        {"archs": Outcome(status=Status.PASS, rows=rows)},
        {"archs": Outcome(status=Status.PASS, rows=rows)},
    )
    assert row.notes[-2:] == (
        "rows identical pristine vs patched",
        "the stack's architectures (patched; config, NMSE, roundtrip): llama Dense OK (1.23e-07) OK",
    )  # the Meta row and qwen3moe are left out
