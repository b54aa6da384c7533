"""A pkg-config that does not answer in time is a runtime failure, never a missing part: under load a
30 s timeout read as "absent" made the CPU lane, every part installed, report gRPC missing (exit 4), and
60-odd slow tests of the busy run on 37f0fda errored on it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.errors import RuntimeFailure
from lanes import cmake, packages


def _slow_pkg_config(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "pkg-config"
    tool.write_text("#!/bin/sh\nsleep 5\n")
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_a_pkg_config_that_does_not_answer_is_not_a_missing_part(tmp_path: Path, monkeypatch) -> None:
    env = _slow_pkg_config(tmp_path)
    monkeypatch.setattr(packages, "PKG_CONFIG_TIMEOUT_S", 0.3)
    with pytest.raises(packages.NoAnswer, match="pkg-config --exists grpc\\+\\+ did not answer within 0 s"):
        packages.module_version("grpc++", env)
    with pytest.raises(RuntimeFailure, match="did not answer") as caught:
        cmake.worker_parts(env)
    assert caught.value.exit_code == 6 and "overloaded" in caught.value.one_line()
