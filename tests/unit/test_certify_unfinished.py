"""A certification that does not finish still says how it ended (issue 20 item 15): ``run.json`` is
written for a DgrError, an unexpected exception and SIGTERM (test_certify_sigterm), and the error's own
advice comes before the generic "nothing was signed" hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from certify import measure
from certify import run as run_mod
from core.errors import ConfigurationError
from tests.unit.certify_fixtures import certify_fake


def _record(tmp_path: Path) -> dict:
    runs = list((tmp_path / "work" / "runs").iterdir())
    assert len(runs) == 1
    return json.loads((runs[0] / "run.json").read_text())


def test_the_errors_own_hint_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_mod, "ctx_size", lambda recipe: 8)  # workers too small for the prompts
    with pytest.raises(ConfigurationError) as err:
        certify_fake(tmp_path)
    line = err.value.one_line()
    assert "start its worker with a larger --ctx or shorten the prompts" in line, line
    assert line.index("larger --ctx") < line.index("nothing was signed"), line
    record = _record(tmp_path)
    assert record["status"] == "ERROR" and "larger --ctx" in record["error"]


def _boom(*args: object, **kwargs: object) -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize("where", ["measure", "publish"])
def test_an_unexpected_exception_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setattr(*((measure, "run") if where == "measure" else (run_mod, "publish")), _boom)
    with pytest.raises(RuntimeError, match="boom"):
        certify_fake(tmp_path)
    record = _record(tmp_path)
    assert record["status"] == "ERROR"
    assert record["error"] == "unexpected RuntimeError: boom"
    assert record["finished"] >= record["started"]
    if where == "publish":
        assert record["unsigned_verdict"] == "PASS"  # measured, then the signing step broke
    assert not list((tmp_path / "work" / "reports").rglob("certificate.json"))
