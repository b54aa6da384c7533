"""The import contracts (pyproject.toml, [tool.importlinter]) hold, and they can fail.

`lint-imports` runs here so the test command, not only `nox -s lint`, fails on a new upward import or an
import cycle. The second test plants an upward import in a copy of the tree and checks the contracts
catch it, so a contract that silently checks nothing cannot pass."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.is_file():
        pytest.fail(f"no lint-imports beside {sys.executable}: install the test extra ('.[test]')")
    env = {**os.environ, "PYTHONPATH": str(root)}  # the tree under test shadows any installed copy
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_import_contracts_hold() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in done.stdout


def _copy_tree(dest: Path) -> None:
    for package in CONFIG["root_packages"]:
        skip = shutil.ignore_patterns("__pycache__", "*.json", "*.patch", "src", "tools")
        shutil.copytree(REPO / package, dest / package, ignore=skip)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")


@pytest.mark.parametrize(
    ("module", "planted", "broken", "named"),
    [
        ("fetch/provision.py", "import lanes.build", "one-way layers", "fetch.provision -> lanes.build"),
        (
            "core/proc.py",
            "import certify.verdict",
            "the kernel imports nothing",
            "core.proc -> certify.verdict",
        ),
        ("certify/inputs.py", "import certify.run", "no import cycle", "No cycles are allowed in certify."),
    ],
)
def test_a_planted_upward_import_or_cycle_breaks_a_contract(
    tmp_path: Path, module: str, planted: str, broken: str, named: str
) -> None:
    _copy_tree(tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _planted() -> None:\n    {planted}  # noqa\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    report = done.stdout.split("Broken contracts", 1)[-1]
    assert broken in report and named in report, done.stdout[-4000:]


def test_the_kernel_uses_only_the_standard_library_blake3_and_platformdirs() -> None:
    allowed = set(sys.stdlib_module_names) | {"blake3", "platformdirs", "core", "__future__"}
    outside = []
    for path in sorted((REPO / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            outside += [f"{path.name}: {n}" for n in names if n and n.split(".")[0] not in allowed]
    assert not outside, outside
