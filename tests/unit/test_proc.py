"""The subprocess helper against real `sys.executable -c` children."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from core import proc
from core.errors import CommandFailed, CommandTimeout, RuntimeFailure, ToolchainMissing

PY = sys.executable


def test_success_captures_merged_output() -> None:
    done = proc.run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    assert done.returncode == 0
    assert "out" in done.output and "err" in done.output
    assert done.argv[0] == PY
    assert done.seconds >= 0


def test_failure_carries_exit_code_and_stderr_tail() -> None:
    code = "import sys\nfor i in range(100): print(f'line {i}', file=sys.stderr)\nsys.exit(7)"
    with pytest.raises(CommandFailed) as err:
        proc.run([PY, "-c", code])
    exc = err.value
    assert exc.returncode == 7
    assert exc.exit_code == RuntimeFailure.exit_code == 6
    assert "exited 7" in exc.message and "line 99" in exc.message
    tail = exc.tail.splitlines()
    assert len(tail) == proc.TAIL_LINES and tail[-1] == "line 99" and "line 0" not in tail


def test_check_false_returns_the_code() -> None:
    done = proc.run([PY, "-c", "raise SystemExit(3)"], check=False)
    assert done.returncode == 3


def test_missing_program_is_toolchain_missing_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ToolchainMissing) as err:
        proc.run(["dgr-no-such-tool-xyz", "--version"], env={"PATH": str(tmp_path)})
    assert "dgr-no-such-tool-xyz" in err.value.message
    assert err.value.exit_code == 4


def test_non_executable_path_is_toolchain_missing(tmp_path: Path) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ToolchainMissing):
        proc.run([str(script)])


def test_program_is_resolved_on_the_given_path(tmp_path: Path) -> None:
    tool = tmp_path / "mytool"
    tool.write_text(f"#!{PY}\nprint('from mytool')\n")
    tool.chmod(0o755)
    assert proc.output_of(["mytool"], env={"PATH": str(tmp_path)}) == "from mytool"


def test_env_mapping_reaches_the_child() -> None:
    env = dict(os.environ, DGR_PROBE="seen-by-child")
    assert proc.output_of([PY, "-c", "import os; print(os.environ['DGR_PROBE'])"], env=env) == "seen-by-child"


def test_stdin_data_is_fed() -> None:
    out = proc.output_of([PY, "-c", "import sys; print(sys.stdin.read().upper())"], stdin_data=b"abc")
    assert out == "ABC"


def test_silent_child_is_stopped_by_the_no_output_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="printed nothing"):
        proc.run([PY, "-c", "import time; print('start', flush=True); time.sleep(30)"], no_output_timeout=0.5)
    assert time.monotonic() - started < 10


def test_a_chatty_child_outlives_the_no_output_timeout() -> None:
    # Runs twice as long as the timeout, printing every 0.5 s.  The timeout is 3 s, not 0.5 s: the first
    # line comes only after the interpreter starts, which took over 0.5 s with both cores busy.
    code = "import time\nfor i in range(12):\n    print(i, flush=True); time.sleep(0.5)"
    started = time.monotonic()
    done = proc.run([PY, "-c", code], no_output_timeout=3.0)
    assert done.output.split() == [str(i) for i in range(12)]
    assert time.monotonic() - started > 3.0
