"""Regression tests for what `nox -s fuzz` found (issue 20 item 18): each input, saved as the fuzzer
wrote it under tests/unit/fuzz_findings/, must now give the project's typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import IntegrityError
from patches.stack import touched_paths
from tests.fuzz import targets

FINDINGS = Path(__file__).parent / "fuzz_findings"


@pytest.mark.parametrize("path", sorted(FINDINGS.iterdir()), ids=lambda p: p.name)
def test_every_saved_finding_is_a_typed_error_now(path: Path) -> None:
    target = {"patch": "patch"}[path.name.split("-", 1)[0]]
    assert targets.run_one(target, path.read_bytes()) is False


@pytest.mark.parametrize("escape", ["\\3fc", "\\q", "\\8", "\\477", "\\12"])
def test_a_quoted_path_with_bad_quoting_is_refused(escape: str) -> None:
    """Found by atheris: a backslash, a digit, then no octal (ValueError from int(.., 8)); git's
    unquote_c_style accepts only \\[0-3][0-7][0-7] and the named escapes, so the judge does too."""
    patch = f'diff --git "a/x{escape}y" b/x\n'.encode()
    with pytest.raises(IntegrityError, match="bad quoting"):
        touched_paths(patch, "p.patch")


def test_octal_escapes_git_writes_still_read() -> None:
    patch = b'diff --git "a/caf\\303\\251" "b/caf\\303\\251"\n'
    assert touched_paths(patch, "p.patch") == ["café", "café"]
