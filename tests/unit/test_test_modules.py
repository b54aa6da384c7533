"""Every test module's file name is unique across tests/: pytest imports them by base name (the test
folders are not packages), so a second ``test_x.py`` in another folder fails collection of the whole run
("import file mismatch"), as tests/integration/test_state_census.py did beside tests/unit's, on a fresh
clone only (a developer running one folder at a time never collects both)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert [n for n, count in names.items() if count > 1] == []
