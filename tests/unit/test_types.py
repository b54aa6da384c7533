"""pyright finds no type error in the product code (pyproject.toml, [tool.pyright]), and it can fail.

pyright runs here so the test command, not only `nox -s lint`, fails on a type error. The second test
plants errors in a copy of the tree: a str passed where an int is expected, in a package checked in
standard mode (a route's decode length given as a str among them), and a parameter without a type in
each package held to strict. Each must be reported
where it was planted, so a configuration that silently checks nothing (or drops strict) cannot pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pyright"]
PYRIGHT = Path(sys.executable).with_name("pyright")

# module, the code appended to it, the rule pyright must report on the line marked "# planted"
PLANTED = [
    (
        "cli/balance.py",
        "def planted() -> object:\n    from core.canonical import parse_json\n\n"
        '    return parse_json(b"{}", source="planted", max_depth="64")  # planted\n',
        "reportArgumentType",
    ),
    (  # a decode length given as a str where the route's driver expects an int
        "certify/measure.py",
        "def planted() -> object:\n    from pipeline import drive\n\n"
        '    return drive.measure_speed([], [1], "4")  # planted\n',
        "reportArgumentType",
    ),
    ("core/proc.py", "def planted(value):  # planted\n    return value\n", "reportMissingParameterType"),
    (
        "pipeline/routes.py",
        "def planted(value):  # planted\n    return value\n",
        "reportMissingParameterType",
    ),
    (
        "manifests/loader.py",
        "def planted(value):  # planted\n    return value\n",
        "reportMissingParameterType",
    ),
]


def _pyright(root: Path, *files: str) -> dict[str, Any]:
    """pyright's JSON report over ``files`` (the whole configured project when none), run in ``root``."""
    if not PYRIGHT.is_file():
        pytest.fail(f"no pyright beside {sys.executable}: install the test extra ('.[test]')")
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}  # no "newer version" notice
    done = subprocess.run(
        [str(PYRIGHT), "--pythonpath", sys.executable, "--outputjson", *files],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode in (0, 1), done.stdout[-4000:] + done.stderr[-2000:]  # 0 clean, 1 errors found
    return json.loads(done.stdout)


def _errors(report: dict[str, Any], root: Path) -> list[str]:
    return [
        f"{Path(d['file']).relative_to(root)}:{d['range']['start']['line'] + 1}: "
        f"{d['message']} ({d.get('rule', '')})"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]


def test_the_product_code_has_no_type_error() -> None:
    report = _pyright(REPO)
    errors = _errors(report, REPO)
    assert not errors, f"{len(errors)} pyright errors:\n" + "\n".join(errors)
    assert report["summary"]["filesAnalyzed"] > 100  # the product packages, not an empty include


def _copy_tree(dest: Path) -> None:
    for package in CONFIG["include"]:
        skip = shutil.ignore_patterns("__pycache__", "*.json", "*.patch", "src", "tools")
        shutil.copytree(REPO / package, dest / package, ignore=skip)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")


@pytest.mark.slow  # a second whole pyright run: the slow suite's, so the fast one stays fast
def test_a_planted_type_error_is_reported(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    lines: dict[str, int] = {}
    for module, planted, _rule in PLANTED:
        target = tmp_path / module
        text = target.read_text() + "\n\n"
        marked = next(k for k, line in enumerate(planted.splitlines()) if line.endswith("# planted"))
        lines[module] = text.count("\n") + 1 + marked
        target.write_text(text + planted)
    errors = _errors(_pyright(tmp_path, *(module for module, _, _ in PLANTED)), tmp_path)
    for module, _planted, rule in PLANTED:
        found = [e for e in errors if e.startswith(f"{module}:{lines[module]}: ") and e.endswith(f"({rule})")]
        assert found, f"no {rule} at {module}:{lines[module]}; pyright said:\n" + "\n".join(errors)
