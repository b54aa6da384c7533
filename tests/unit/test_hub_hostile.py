"""Issue 42, hub origin: hostile input from the operator's environment and from the hub itself.

Every failure of `dgr seal --from hub:` and `dgr provision` from a hub origin is one line on stderr with
its exit code, never a traceback, and no secret (a token, a URL's password) reaches any stream: each
test plants the secrets and reads stdout, stderr and every log line for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.context import Context
from tests.unit.hubcase import PATHS, REPO, HubCase, hub_case, run_cli

SECRET = "hf_planted_Secret_9f3"  # what a token holds, before a line break an attacker adds
PASSWORD = "pw-Planted-7c1"
SEAL = ("seal", "--artifacts", "hubset", "--from", f"hub:{REPO}@main", "--include", "Q4/*.gguf")


@pytest.fixture
def case(tmp_path: Path, ctx: Context) -> Iterator[HubCase]:
    with hub_case(tmp_path, ctx) as made:
        yield made


@pytest.fixture
def said(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> Iterator[Said]:
    caplog.set_level(logging.DEBUG)
    yield Said(capsys, caplog)


class Said:
    """Everything a command said: stdout, stderr and every log record, rendered."""

    def __init__(self, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
        self.capsys, self.caplog = capsys, caplog

    def read(self) -> tuple[list[str], str]:
        """(stderr's lines, everything said) since the last read."""
        out = self.capsys.readouterr()
        logged = "\n".join(r.getMessage() for r in self.caplog.records)
        self.caplog.clear()
        return out.err.strip().splitlines(), out.out + out.err + logged


def _argv(case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str) -> tuple[str, ...]:
    """The command line of ``command``; for provision, the set is sealed first (and what that said is
    read), so the secrets planted afterwards meet provisioning alone."""
    if command == "seal":
        return SEAL
    assert run_cli(case, monkeypatch, *SEAL) == 0
    said.read()
    return ("provision", "--artifacts", "hubset", "--store", str(case.store))


@pytest.mark.parametrize("command", ["seal", "provision"])
def test_a_token_with_a_line_break_is_refused_naming_the_variable(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str
) -> None:
    argv = _argv(case, monkeypatch, said, command)
    case.env["HF_TOKEN"] = f"{SECRET}\r\nX-Leak: 1"
    asked = len(case.hub.seen)
    rc = run_cli(case, monkeypatch, *argv)
    err, everything = said.read()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("dgr: configuration error: ") and "HF_TOKEN" in err[0]
    assert SECRET not in everything and "X-Leak" not in everything
    assert len(case.hub.seen) == asked  # refused before anything is asked of the hub


def test_a_token_file_with_a_line_break_is_refused_naming_the_file(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said
) -> None:
    del case.env["HF_TOKEN"]
    token_file = case.tmp / "hf-token"
    token_file.write_text(f"{SECRET}\nX-Leak: 1\n")
    case.env["HF_TOKEN_PATH"] = str(token_file)
    rc = run_cli(case, monkeypatch, *SEAL)
    err, everything = said.read()
    assert rc == 2 and len(err) == 1 and str(token_file) in err[0], err
    assert SECRET not in everything and "X-Leak" not in everything


@pytest.mark.parametrize("command", ["provision"])  # seal: with the API failures, below
def test_a_password_in_the_endpoint_never_reaches_a_stream(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str
) -> None:
    argv = _argv(case, monkeypatch, said, command)
    case.env["HF_ENDPOINT"] = f"http://operator:{PASSWORD}@{case.hub.netloc}"
    case.hub.rate_limit, case.hub.busy_status, case.hub.retry_after = 1000, 503, "0"
    rc = run_cli(case, monkeypatch, *argv)
    err, everything = said.read()
    assert rc == 6 and len(err) == 1, err
    assert "503" in everything and PASSWORD not in everything
    assert "***@" in err[0] or case.hub.netloc in err[0]
    assert not case.published(PATHS[0]).exists()
