"""Issue 20 items 2, 5 and 9: crafted certificates against `dgr verify` and the report index.

The good certificate is the signed WAN evidence run's statement, re-signed here with the test
workspace's dev key (its predicate is a real one, so it validates against the schema).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from certify import certificate as cert
from certify import keys
from certify.verify import verify
from core.canonical import sha256_file
from core.context import Context
from core.errors import IntegrityError
from core.workspace import PROJECT_ROOT
from reports.index import render_index, scan

EVIDENCE = PROJECT_ROOT / "evidence" / "tiny-llama-wan-cpu" / "certificate.json"


def _statement() -> dict[str, Any]:
    return json.loads(base64.b64decode(json.loads(EVIDENCE.read_text())["payload"]))


def _signed(ctx: Context, run_dir: Path, stmt: dict[str, Any], *, html: str = "<p>report</p>\n") -> Path:
    """Write ``stmt`` signed with the workspace dev key, and its report page, into ``run_dir``."""
    key = keys.dev_key(ctx.workspace)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "report.html").write_text(html)
    pred = stmt["predicate"]
    pred["signer"] = dict(pred["signer"], keyid=key.keyid)
    pred["report"] = {"file": "report.html", "html_sha256": sha256_file(run_dir / "report.html")}
    path = run_dir / "certificate.json"
    cert.write(path, cert.sign(stmt, key))
    return path


def _dgr(ctx: Context, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "certify", *args],
        cwd=PROJECT_ROOT,
        env=dict(ctx.env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _only_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_the_resigned_evidence_verifies(ctx: Context, tmp_path: Path) -> None:
    path = _signed(ctx, tmp_path / "r", _statement())
    v = verify(path, keys.trusted_keys(ws=ctx.workspace), subjects=False)
    assert v.ok, [ln.text() for ln in v.failures]


BAD_SIG = base64.b64encode(bytes(64)).decode()
# keyid is an unsigned hint: a crafted one only matters (and once crashed) when no key verifies
CRAFTED_ENVELOPES = {
    "list keyid": lambda e: e["signatures"][0].update(keyid=["a", "b"], sig=BAD_SIG),
    "dict keyid": lambda e: e["signatures"][0].update(keyid={"x": 1}, sig=BAD_SIG),
    "number keyid": lambda e: e["signatures"][0].update(keyid=7, sig=BAD_SIG),
    "null keyid": lambda e: e["signatures"][0].update(keyid=None, sig=BAD_SIG),
    "deep payload": lambda e: e.update(payload=base64.b64encode(b"[" * 1000 + b"]" * 1000).decode()),
    "list payload": lambda e: e.update(payload=base64.b64encode(b"[1, 2]").decode()),
    "nan payload": lambda e: e.update(payload=base64.b64encode(b'{"a": NaN}').decode()),
    "lone surrogate payloadType": lambda e: e.update(payloadType="\udc80"),
    "lone surrogate keyid": lambda e: e["signatures"][0].update(keyid="\udc80"),
}


def _crafted_statements() -> dict[str, dict[str, Any]]:
    out = {}
    for name, edit in {
        "predicate list": lambda s: s.update(predicate=[1, 2]),
        "subject not an object": lambda s: s.update(subject=["x", 3]),
        "subject digest a list": lambda s: s["subject"][0].update(digest=["sha256"]),
        "subject name a list": lambda s: s["subject"][0].update(name=["a"]),
        "local_paths a list": lambda s: s["predicate"].update(local_paths=[1]),
        "local path a number": lambda s: s["predicate"].update(local_paths={s["subject"][0]["name"]: 5}),
        "signer a list": lambda s: s["predicate"].update(signer=[1]),
        "report a string": lambda s: s["predicate"].update(report="x"),
    }.items():
        stmt = _statement()
        edit(stmt)
        out[name] = stmt
    return out


@pytest.mark.parametrize("case", sorted(CRAFTED_ENVELOPES))
def test_crafted_envelope_fails_verify_with_one_line(ctx: Context, tmp_path: Path, case: str) -> None:
    path = _signed(ctx, tmp_path / "r", _statement())
    envelope = json.loads(path.read_text())
    CRAFTED_ENVELOPES[case](envelope)
    path.write_text(json.dumps(envelope))
    done = _dgr(ctx, "verify", str(path))
    assert done.returncode == 3, done.stdout + done.stderr
    assert _only_error_line(done).startswith("dgr: integrity error:")


def test_a_lone_surrogate_in_the_signed_payload_exits_3(ctx: Context, tmp_path: Path) -> None:
    """A payload signed by a trusted key whose JSON holds a \\udc80 escape: once exit 0 with the raw
    surrogate printed (or a UnicodeEncodeError traceback, by locale); now the statement is refused."""
    path = _signed(ctx, tmp_path / "r", _statement())
    envelope = json.loads(path.read_text())
    payload = base64.b64decode(envelope["payload"])
    assert b'"recipe":{"' in payload
    payload = payload.replace(b'"recipe":{"', b'"recipe":{"\\udc80":1,"', 1)
    key = keys.dev_key(ctx.workspace)
    envelope["payload"] = base64.b64encode(payload).decode()
    envelope["signatures"] = [
        {"keyid": key.keyid, "sig": base64.b64encode(key.sign(cert.pae(cert.PAYLOAD_TYPE, payload))).decode()}
    ]
    path.write_text(json.dumps(envelope))
    done = _dgr(ctx, "verify", str(path))
    assert done.returncode == 3, done.stdout + done.stderr
    line = _only_error_line(done)
    assert line.startswith("dgr: integrity error:") and "statement" in line and "lone surrogate" in line, line


def test_too_many_signatures_are_refused_before_any_is_checked(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bogus signature was tried against every trusted key (250,000 of them: minutes of CPU)."""
    path = _signed(ctx, tmp_path / "r", _statement())
    envelope = json.loads(path.read_text())
    envelope["signatures"] += [{"keyid": "x", "sig": BAD_SIG}] * cert.MAX_SIGNATURES
    path.write_text(json.dumps(envelope))
    checked: list[bytes] = []
    monkeypatch.setattr(keys.TrustedKey, "verifies", lambda self, sig, message: checked.append(sig) or False)
    with pytest.raises(IntegrityError, match=f"carries {cert.MAX_SIGNATURES + 1} signatures"):
        verify(path, keys.trusted_keys(ws=ctx.workspace))
    assert checked == []


def test_an_envelope_of_250000_signatures_exits_3_with_one_line(ctx: Context, tmp_path: Path) -> None:
    path = _signed(ctx, tmp_path / "r", _statement())
    envelope = json.loads(path.read_text())
    envelope["signatures"] = [{"keyid": "x", "sig": BAD_SIG}] * 250_000
    path.write_text(json.dumps(envelope))
    done = _dgr(ctx, "verify", str(path))
    assert done.returncode == 3, done.stdout + done.stderr
    line = _only_error_line(done)
    assert "carries 250000 signatures" in line and "before any is checked" in line, line


def test_a_key_that_is_not_a_regular_file_exits_2(ctx: Context, tmp_path: Path) -> None:
    """--key /dev/zero read until memory ran out; a FIFO blocked."""
    path = _signed(ctx, tmp_path / "r", _statement())
    fifo = tmp_path / "key.pem"
    os.mkfifo(fifo)
    for key in (fifo, Path("/dev/zero")):
        done = _dgr(ctx, "verify", str(path), "--key", str(key))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is not a regular file" in _only_error_line(done)


def _signed_statement_edit(ctx: Context, run_dir: Path, stmt: dict[str, Any]) -> Path:
    """Sign ``stmt`` as it is (a crafted predicate has no signer/report to fill in)."""
    key = keys.dev_key(ctx.workspace)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "certificate.json"
    cert.write(path, cert.sign(stmt, key))
    return path


@pytest.mark.parametrize("case", sorted(_crafted_statements()))
def test_crafted_statement_signed_by_a_trusted_key_fails_typed(
    ctx: Context, tmp_path: Path, case: str
) -> None:
    path = _signed_statement_edit(ctx, tmp_path / "r", _crafted_statements()[case])
    done = _dgr(ctx, "verify", str(path))
    assert done.returncode in (0, 3), done.stdout + done.stderr
    if done.returncode == 3:
        assert _only_error_line(done).startswith("dgr: integrity error:")
    assert "Traceback" not in done.stderr


def _reports_with_one_bad(ctx: Context, tmp_path: Path, bad: bytes) -> Path:
    reports = tmp_path / "reports"
    _signed(ctx, reports / "tiny-llama-wan" / "cpu" / "run-good", _statement())
    broken = reports / "tiny-llama" / "cpu" / "run-bad"
    broken.mkdir(parents=True)
    (broken / "certificate.json").write_bytes(bad)
    return reports


@pytest.mark.parametrize("bad", [b"[" * 1000 + b"]" * 1000, b'{"payload": "x", "payload": "y"}'])
def test_report_lists_a_bad_certificate_and_renders_the_rest(
    ctx: Context, tmp_path: Path, bad: bytes
) -> None:
    reports = _reports_with_one_bad(ctx, tmp_path, bad)
    entries = {e.certificate.parent.name: e for e in scan(reports, keys.trusted_keys(ws=ctx.workspace))}
    assert entries["run-good"].verified and entries["run-good"].verdict == "PASS"
    assert not entries["run-bad"].verified and "not valid JSON" in entries["run-bad"].problem
    done = _dgr(ctx, "report", "--reports", str(reports))
    assert done.returncode == 0, done.stdout + done.stderr
    html = (reports / "index.html").read_text()
    assert "run-bad" in html and "not valid JSON" in html
    assert "tiny-llama-wan/cpu/run-good/report.html" in html


def test_report_index_survives_crafted_envelopes(ctx: Context, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    for i, (case, edit) in enumerate(sorted(CRAFTED_ENVELOPES.items())):
        path = _signed(ctx, reports / "tiny-llama-wan" / "cpu" / f"run-{i}", _statement())
        envelope = json.loads(path.read_text())
        edit(envelope)
        path.write_text(json.dumps(envelope))
        assert case
    for i, stmt in enumerate(_crafted_statements().values()):
        _signed_statement_edit(ctx, reports / "tiny-llama-wan" / "cpu" / f"stmt-{i}", stmt)
    entries = scan(reports, keys.trusted_keys(ws=ctx.workspace))
    assert len(entries) == len(CRAFTED_ENVELOPES) + len(_crafted_statements())
    assert all(not e.verified for e in entries if e.certificate.parent.name.startswith("run-"))
    render_index(ctx, reports)


def _artifact_statement(ctx: Context, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A certificate whose one artifact subject was recorded at ``recorded``; a store copy is truncated."""
    blob = os.urandom(4096)
    recorded = tmp_path / "recorded" / "s" / "v" / "m.gguf"
    recorded.parent.mkdir(parents=True)
    recorded.write_bytes(blob)
    store = tmp_path / "store"
    (store / "s" / "v").mkdir(parents=True)
    (store / "s" / "v" / "m.gguf").write_bytes(blob[:1000])
    stmt = _statement()
    digests = cert.file_digests(recorded)
    stmt["subject"] = [cert.subject("artifacts/s/v/m.gguf", digests)]
    stmt["predicate"]["local_paths"] = {"artifacts/s/v/m.gguf": str(recorded)}
    return _signed(ctx, tmp_path / "r", stmt), recorded, store


def test_verify_store_checks_the_store_given(ctx: Context, tmp_path: Path) -> None:
    path, recorded, store = _artifact_statement(ctx, tmp_path)
    done = _dgr(ctx, "verify", str(path))
    assert done.returncode == 0 and f"match {recorded}" in done.stdout, done.stdout + done.stderr
    done = _dgr(ctx, "verify", str(path), "--store", str(store))
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"sha256 mismatch for {store}/s/v/m.gguf" in _only_error_line(done)
    empty = tmp_path / "empty-store"
    empty.mkdir()
    done = _dgr(ctx, "verify", str(path), "--store", str(empty))
    assert f"file not present in store {empty}" in done.stdout and str(recorded) not in done.stdout
