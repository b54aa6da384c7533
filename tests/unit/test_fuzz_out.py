"""`python -m tests.fuzz.run` writes into the workspace (DGR_WORK) by default, like every other command,
not into the checkout's .work/ whatever DGR_WORK says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz import run


def test_the_default_out_is_the_workspaces_fuzz_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DGR_WORK", str(tmp_path / "work"))
    asked: list[Path] = []
    monkeypatch.setattr(run, "plan", lambda names, out: asked.append(out) or [])
    assert run.main(["--seconds", "1"]) == 0
    assert asked == [tmp_path / "work" / "fuzz"]
    assert run.main(["--out", str(tmp_path / "elsewhere")]) == 0
    assert asked[-1] == tmp_path / "elsewhere"
