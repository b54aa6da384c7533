"""No function in certify/, pipeline/ or fetch/ is over 50 lines (issue 40: each reads at once).

Counted as the ruff-formatted file has it, from ``def`` (decorators aside) to the last line of the body,
docstring included.  A function that grows past it is split into named steps, not exempted here."""

from __future__ import annotations

import ast
from pathlib import Path

from core.workspace import PROJECT_ROOT

PACKAGES = ("certify", "pipeline", "fetch")
MOST_LINES = 50


def _long_functions(root: Path = PROJECT_ROOT) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MOST_LINES:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_driving_packages_is_over_50_lines() -> None:
    assert not _long_functions(), "\n".join(_long_functions())


def test_the_count_sees_a_long_function(tmp_path: Path) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    body = "\n".join(f"    x{k} = {k}" for k in range(MOST_LINES))
    (tmp_path / "fetch" / "long.py").write_text(
        f"def fits():\n{body[: body.rindex(chr(10))]}\n\n\ndef long():\n{body}\n"
    )
    assert _long_functions(tmp_path) == [
        f"fetch/long.py:{MOST_LINES + 3} long (51 lines)"
    ]  # fits: 50 lines, then two blank
