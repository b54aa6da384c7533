"""Certificates: DSSE/in-toto shape, Ed25519 signing, and verify's specific reason for each kind of
tampering (RELIABILITY 21)."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from certify import certificate as cert
from certify import gates, hardware, keys
from certify.run import FinishedRun, Prepared, Run, Written, publish
from certify.verdict import decide
from certify.verify import verify
from core.canonical import canonical_bytes
from core.context import Context
from core.errors import ConfigurationError, IntegrityError
from core.workspace import PROJECT_ROOT
from manifests.recipe_model import load
from reports.render import render

RECIPE = load("tiny-llama", {})
HC = RECIPE.hardware_class("cpu", 2)


def make_certificate(ctx: Context, tmp: Path, *, bad: bool = False) -> Written:
    """A real signed certificate over real files, from hand-made gate figures (no workers)."""
    art = tmp / "store" / "tiny-llama" / "f32"
    art.mkdir(parents=True, exist_ok=True)
    files = {
        "artifacts/tiny-llama/f32/m-00001-of-00002.gguf": art / "m-00001-of-00002.gguf",
        "artifacts/tiny-llama/f32/m-00002-of-00002.gguf": art / "m-00002-of-00002.gguf",
    }
    for i, p in enumerate(files.values()):
        p.write_bytes(bytes([i]) * 4096)
    binary = tmp / "bin" / "dgr-shard-worker"
    binary.parent.mkdir(exist_ok=True)
    binary.write_bytes(b"\x7fELF pretend worker")
    files["build/cpu/dgr-shard-worker"] = binary
    subjects = [cert.subject(name, cert.file_digests(p)) for name, p in files.items()]
    figures = {
        "top1_agreement": 0.5 if bad else 1.0,
        "kl_mean": 0.0,
        "kl_max": 0.0,
        "logits_nmse": 0.0,
        "greedy_match": 1.0,
        "boundary_nmse@6": 0.0,
    }
    results = [
        gates.evaluate(
            "staging-parity",
            "two-middle",
            gates.staging_parity_checks(HC.staging_parity, RECIPE.placements["two-middle"]),
            figures,
        )
    ]
    prepared = Prepared(
        model=files["artifacts/tiny-llama/f32/m-00001-of-00002.gguf"],
        worker=(str(binary),),
        identity={
            "source": {"commit": "4df29be4f4c3673f428170fda944a5b19f743bb8"},
            "patches": {"digest": "p"},
            "build": {"key": "k", "lane": "cpu"},
            "artifacts": {"set": "tiny-llama", "manifest_digest": "m"},
        },
        subjects=subjects,
        local_paths={n: str(p) for n, p in files.items()},
        verified=["test files"],
    )
    now = time.time()
    run = Run(
        recipe=RECIPE,
        lane="cpu",
        run_id="20260101T000000Z-abcdef",
        started=now,
        evidence=ctx.workspace.runs / "x",
    )
    done = FinishedRun(
        run=run,
        hardware_class=HC,
        finished=now + 1,
        results=results,
        figures={"placements": []},
        fingerprint=hardware.fingerprint(ctx.env),
        prepared=prepared,
        verdict=decide(results),
    )
    return publish(ctx, done, key=keys.signing_key(ctx.env, ctx.workspace), render=render)


def trusted(ctx: Context) -> dict[str, keys.TrustedKey]:
    return keys.trusted_keys(ws=ctx.workspace, directory=ctx.workspace.root / "no-keys")


def reasons(v: Any) -> str:
    return "\n".join(f"{ln.what}: {ln.detail}" for ln in v.failures)


def resign(path: Path, stmt: dict[str, Any], key: keys.SigningKey) -> None:
    cert.write(path, cert.sign(stmt, key))


def payload_of(path: Path) -> dict[str, Any]:
    env = json.loads(path.read_text())
    return json.loads(base64.b64decode(env["payload"]))


def test_pae_matches_the_dsse_spec() -> None:
    assert (
        cert.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_statement_shape_and_clean_verify(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    env = json.loads(w.certificate.read_text())
    assert env["payloadType"] == "application/vnd.in-toto+json"
    stmt = payload_of(w.certificate)
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == cert.PREDICATE_TYPE
    assert all(set(s["digest"]) == {"sha256", "blake3"} for s in stmt["subject"])
    pred = stmt["predicate"]
    assert pred["hardware"]["self_reported"] is True and pred["signer"]["dev_key"] is True
    assert pred["recipe"]["digest"] == RECIPE.digest and pred["verdict"]["status"] == "PASS"
    limits = pred["recipe"]["thresholds"]["staging_parity"]
    assert limits["logits_nmse_max"] == HC.staging_parity.logits_nmse_max
    v = verify(w.certificate, trusted(ctx))
    assert v.ok, reasons(v)
    assert [ln.status for ln in v.lines].count(
        "ok"
    ) >= 6  # payloadType, signature, statement, 3 subjects, html
    assert any(ln.detail == "dev key, not trusted for publication" for ln in v.lines)


def test_one_changed_payload_byte(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    env = json.loads(w.certificate.read_text())
    payload = bytearray(base64.b64decode(env["payload"]))
    i = payload.index(b'"PASS"') + 2
    payload[i] ^= 0x01  # "PASS" -> "QASS": one byte
    env["payload"] = base64.b64encode(bytes(payload)).decode()
    w.certificate.write_text(json.dumps(env))
    v = verify(w.certificate, trusted(ctx))
    assert "signature: does not verify with trusted key" in reasons(v)
    assert "payload or the signature was changed" in reasons(v)


def test_swapped_subject_digest(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    stmt = payload_of(w.certificate)
    a, b = stmt["subject"][0], stmt["subject"][1]
    a["digest"], b["digest"] = b["digest"], a["digest"]
    # Re-signed by the same trusted key: the signature holds, the files do not match.
    resign(w.certificate, stmt, keys.dev_key(ctx.workspace))
    v = verify(w.certificate, trusted(ctx))
    text = reasons(v)
    assert f"subject {a['name']}: sha256 mismatch" in text and f"subject {b['name']}: sha256 mismatch" in text
    assert "signature" not in text


def test_swapped_digest_without_resigning_breaks_the_signature(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    env = json.loads(w.certificate.read_text())
    stmt = payload_of(w.certificate)
    stmt["subject"][0]["digest"]["sha256"] = "0" * 64
    env["payload"] = base64.b64encode(canonical_bytes(stmt)).decode()
    w.certificate.write_text(json.dumps(env))
    assert "signature: does not verify" in reasons(verify(w.certificate, trusted(ctx)))


def test_changed_artifact_file(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    target = tmp_path / "store" / "tiny-llama" / "f32" / "m-00002-of-00002.gguf"
    data = bytearray(target.read_bytes())
    data[100] ^= 0x80
    target.write_bytes(bytes(data))
    text = reasons(verify(w.certificate, trusted(ctx)))
    assert "subject artifacts/tiny-llama/f32/m-00002-of-00002.gguf: sha256 mismatch" in text


def test_wrong_payload_type(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    env = json.loads(w.certificate.read_text())
    env["payloadType"] = "application/json"
    w.certificate.write_text(json.dumps(env))
    v = verify(w.certificate, trusted(ctx))
    assert v.failures[0].what == "payloadType"
    assert "is 'application/json', expected 'application/vnd.in-toto+json'" in v.failures[0].detail


def test_untrusted_key(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    stranger = Ed25519PrivateKey.generate()
    sk = keys.SigningKey(
        private=stranger,
        keyid=keys.keyid(stranger.public_key()),
        dev_key=False,
        path=tmp_path / "none",
        public_path=None,
    )
    stmt = payload_of(w.certificate)
    stmt["predicate"]["signer"]["keyid"] = sk.keyid
    resign(w.certificate, stmt, sk)
    text = reasons(verify(w.certificate, trusted(ctx)))
    assert f"signed by key {sk.keyid[:16]}…, which is not trusted" in text
    # The same certificate verifies once that key is given on the command line.
    pem = tmp_path / "stranger.pem"
    pem.write_bytes(keys.public_pem(stranger.public_key()))
    assert verify(w.certificate, keys.trusted_keys([pem], ws=ctx.workspace)).ok


def test_edited_html(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    w.html.write_text(w.html.read_text().replace("Verdict: PASS", "Verdict: PASS!"))
    text = reasons(verify(w.certificate, trusted(ctx)))
    assert "report HTML:" in text and "does not match the certificate" in text


def test_predicate_version_and_signer_binding(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    stmt = payload_of(w.certificate)
    stmt["predicate"]["schema_version"] = 3
    resign(w.certificate, stmt, keys.dev_key(ctx.workspace))
    assert "schema_version 3 is not supported" in reasons(verify(w.certificate, trusted(ctx)))
    # Version 2 names its two parity gates; a predicate without them is refused.
    stmt["predicate"]["schema_version"] = 2
    gates_section = stmt["predicate"].pop("gates")
    resign(w.certificate, stmt, keys.dev_key(ctx.workspace))
    assert "gates" in reasons(verify(w.certificate, trusted(ctx)))
    stmt["predicate"]["gates"] = gates_section
    stmt["predicate"]["signer"]["keyid"] = "a" * 64
    resign(w.certificate, stmt, keys.dev_key(ctx.workspace))
    assert "the predicate names key aaaa" in reasons(verify(w.certificate, trusted(ctx)))


def test_fail_verdict_is_signed_and_verifies(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path, bad=True)
    assert w.verdict.status.value == "FAIL"
    v = verify(w.certificate, trusted(ctx))
    assert v.ok and v.predicate["verdict"]["status"] == "FAIL"
    assert "top-1 agreement 0.5" in v.predicate["verdict"]["reasons"][0]


def test_not_an_envelope(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("[1, 2]")
    with pytest.raises(IntegrityError, match="not a DSSE envelope"):
        verify(bad, {})


def test_dev_key_is_private_and_stable(ctx: Context) -> None:
    a = keys.dev_key(ctx.workspace)
    assert stat.S_IMODE(os.stat(a.path).st_mode) == 0o600
    assert keys.dev_key(ctx.workspace).keyid == a.keyid
    os.chmod(a.path, 0o644)
    with pytest.raises(IntegrityError, match="readable by others"):
        keys.dev_key(ctx.workspace)


def test_signing_key_from_env(ctx: Context, tmp_path: Path) -> None:
    k = Ed25519PrivateKey.generate()
    pem = tmp_path / "release.pem"
    pem.write_bytes(
        k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    sk = keys.signing_key({"DGR_SIGNING_KEY": str(pem)}, ctx.workspace)
    assert sk.dev_key is False and sk.keyid == keys.keyid(k.public_key())
    ec = tmp_path / "ec.pem"
    ec.write_bytes(
        generate_private_key(SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(ConfigurationError, match="not an Ed25519 key"):
        keys.signing_key({"DGR_SIGNING_KEY": str(ec)}, ctx.workspace)
    with pytest.raises(ConfigurationError, match="not readable"):
        keys.signing_key({"DGR_SIGNING_KEY": str(tmp_path / "missing.pem")}, ctx.workspace)


def test_manifest_keys_folder_holds_no_private_key() -> None:
    for p in (PROJECT_ROOT / "manifests" / "keys").iterdir():
        assert b"PRIVATE KEY" not in p.read_bytes(), p


def test_cli_verify_exit_codes(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    env = dict(ctx.env)
    run = [sys.executable, "-m", "certify", "verify", str(w.certificate)]
    ok = subprocess.run(run, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "verified: tiny-llama on cpu, verdict PASS" in ok.stdout and "dev key" in ok.stdout
    w.html.write_text("<html>edited</html>")
    bad = subprocess.run(run, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 3
    assert bad.stderr.startswith("dgr: integrity error:") and "report HTML" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
