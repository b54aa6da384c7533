"""Issue 42, hub origin: hostile input from the operator's environment and from the hub itself.

Every failure of `dgr seal --from hub:` and `dgr provision` from a hub origin is one line on stderr with
its exit code, never a traceback, and no secret (a token, a URL's password) reaches any stream: each
test plants the secrets and reads stdout, stderr and every log line for them.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.context import Context
from tests.fuzz.seeds import HOSTILE_HUB_ANSWERS
from tests.unit.full_disk import run_on_full_disk
from tests.unit.hubcase import CHUNK, PATHS, REPO, HubCase, hub_case, run_cli

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


def _one_line(rc: int, err: list[str], code: int, kind: str) -> str:
    assert rc == code and len(err) == 1, (rc, err)
    assert err[0].startswith(f"dgr: {kind}: ") and "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("command", ["seal", "provision"])
def test_a_token_with_a_line_break_is_refused_naming_the_variable(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str
) -> None:
    argv = _argv(case, monkeypatch, said, command)
    case.env["HF_TOKEN"] = f"{SECRET}\r\nX-Leak: 1"
    asked = len(case.hub.seen)
    rc = run_cli(case, monkeypatch, *argv)
    err, everything = said.read()
    assert "HF_TOKEN" in _one_line(rc, err, 2, "configuration error")
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
    assert str(token_file) in _one_line(rc, err, 2, "configuration error")
    assert SECRET not in everything and "X-Leak" not in everything


@pytest.mark.parametrize("command", ["seal", "provision"])
def test_a_password_in_the_endpoint_never_reaches_a_stream(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str
) -> None:
    argv = _argv(case, monkeypatch, said, command)
    case.env["HF_ENDPOINT"] = f"http://operator:{PASSWORD}@{case.hub.netloc}"
    case.hub.rate_limit, case.hub.busy_status, case.hub.retry_after = 1000, 503, "0"
    rc = run_cli(case, monkeypatch, *argv)
    err, everything = said.read()
    line = _one_line(rc, err, 6, "runtime failure")
    assert "503" in line and PASSWORD not in everything
    assert not case.published(PATHS[0]).exists()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("command", ["seal", "provision"])
def test_an_unreachable_endpoint_is_one_line_exit_6(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str
) -> None:
    argv = _argv(case, monkeypatch, said, command)
    case.env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    line = _one_line(run_cli(case, monkeypatch, *argv), said.read()[0], 6, "runtime failure")
    assert "ConnectionRefused" in line or "refused" in line


def test_a_dead_proxy_is_one_line_exit_6(case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_closed_port()}")
    line = _one_line(run_cli(case, monkeypatch, *SEAL), said.read()[0], 6, "runtime failure")
    assert "the hub's API" in line and not case.hub.seen


def test_a_503_from_the_api_is_one_line_exit_6(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said
) -> None:
    case.hub.rate_limit, case.hub.busy_status, case.hub.retry_after = 1000, 503, "0"
    line = _one_line(run_cli(case, monkeypatch, *SEAL), said.read()[0], 6, "runtime failure")
    assert "HTTP 503" in line and "/api/models/" in line


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://[::1",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:port",
        "ftp://x",
        "not a url",
        "http://",
        "http://h/ x",
    ],
)
@pytest.mark.parametrize("command", ["seal", "provision"])
def test_a_malformed_endpoint_is_refused_up_front_exit_2(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, command: str, endpoint: str
) -> None:
    argv = _argv(case, monkeypatch, said, command)
    case.env["HF_ENDPOINT"] = endpoint
    asked, started = len(case.hub.seen), time.monotonic()
    line = _one_line(run_cli(case, monkeypatch, *argv), said.read()[0], 2, "configuration error")
    assert "HF_ENDPOINT" in line and len(case.hub.seen) == asked
    assert time.monotonic() - started < 5  # refused, not retried


@pytest.mark.parametrize("shape", sorted(HOSTILE_HUB_ANSWERS))
def test_a_hostile_api_answer_is_refused_in_one_line(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, shape: str
) -> None:
    """Each answer goes through the bounded JSON reader and its schema before anything uses it."""
    kind, body, says = HOSTILE_HUB_ANSWERS[shape]
    case.hub.repos[REPO].answers[kind] = body
    before = (case.manifests / "hubset.json").read_text()
    line = _one_line(run_cli(case, monkeypatch, *SEAL), said.read()[0], 6, "runtime failure")
    assert says in line and len(line) < 1000
    assert (case.manifests / "hubset.json").read_text() == before and not case.storage.seen


def test_a_file_listed_inside_a_selected_file_refuses_the_listing(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said
) -> None:
    """Both paths selected: the second one used to need a folder where the first was staged as a file."""
    repo = case.hub.repos[REPO]
    tree = case.hub.tree(repo)
    tree.append({**tree[0], "path": f"{PATHS[0]}/x.gguf"})
    repo.answers["tree"] = json.dumps(tree).encode()
    argv = [*SEAL[:-1], "Q4/*"]
    line = _one_line(run_cli(case, monkeypatch, *argv), said.read()[0], 6, "runtime failure")
    assert f"{PATHS[0]} both as a file and as a folder" in line and not case.storage.seen


@pytest.mark.parametrize("planted", ["folder", "subfolder", "file"])
def test_a_link_planted_in_the_seals_staging_is_refused(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said, planted: str
) -> None:
    """RELIABILITY 14/25: staging obeys the store's no-links rule; nothing lands where a link points."""
    staging = Path(case.env["DGR_WORK"]) / "staging" / f"hub-hubset-q4-{case.hub.repos[REPO].commit[:12]}"
    elsewhere = case.tmp / "elsewhere"
    elsewhere.mkdir()
    link = {"folder": staging, "subfolder": staging / "Q4", "file": staging / PATHS[0]}[planted]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere / "victim" if planted == "file" else elsewhere)
    line = _one_line(run_cli(case, monkeypatch, *SEAL), said.read()[0], 3, "integrity error")
    assert "symbolic link" in line and str(link) in line
    assert list(elsewhere.iterdir()) == []
    assert "revision" not in case.manifest()["origins"][0]


SEAL_DISK_FULL_CHILD = """
import sys
from pathlib import Path
from cli.main import main
from fetch.seal import seal_hub
from tests.unit.hubcase import FAST
seal_hub.__kwdefaults__.update(root=Path(sys.argv[1]), policy=FAST)
sys.exit(main(sys.argv[2:]))
"""


def test_disk_full_while_staging_a_seal_is_one_line_and_keeps_what_landed(case: HubCase) -> None:
    """A real ENOSPC, as provisioning's test makes one: the workspace is a 256 KiB tmpfs mounted in a
    private mount namespace (the fake hub stays reachable: the network namespace is shared)."""
    work = Path(case.env["DGR_WORK"])
    done = run_on_full_disk(work, SEAL_DISK_FULL_CHILD, [str(case.manifests), *SEAL], case.env)
    said = [line for line in done.stderr.splitlines() if not line.startswith("seal ")]  # progress
    line = _one_line(done.returncode, said, 6, "runtime failure")
    assert "disk full staging" in line and "staged and kept" in line and "more bytes" in line
    staged = int(line.split("staging ", 1)[1].split(": ", 1)[1].split(" of ", 1)[0])
    assert staged > 0 and staged % CHUNK == 0  # whole chunks, where a re-run resumes
    assert "revision" not in case.manifest()["origins"][0]


def test_a_retry_after_in_other_digits_is_read_as_no_wait(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, said: Said
) -> None:
    """'²'.isdigit() is True and float('²') a ValueError: a header's number is ASCII digits or absent."""
    case.hub.rate_limit, case.hub.busy_status, case.hub.retry_after = 1000, 503, "²"
    line = _one_line(run_cli(case, monkeypatch, *SEAL), said.read()[0], 6, "runtime failure")
    assert "HTTP 503" in line


def test_a_linked_size_in_other_digits_is_not_a_size(case: HubCase, monkeypatch: pytest.MonkeyPatch) -> None:
    case.hub.resolve_headers = {"X-Linked-Size": "³²"}
    assert run_cli(case, monkeypatch, *SEAL) == 0  # the tree's size and sha256 still decide
    assert [f["name"] for f in case.manifest()["variants"]["q4"]["files"]] == PATHS
