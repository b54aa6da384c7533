"""A certificate never states a digest without saying how it was established (issue 20 item 7):
artifact subjects carry the manifest's digests after provisioning checked the blake3, so each says so;
binaries are hashed when the certificate is made.  Certificates made before this still verify."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from certify import certificate as cert
from certify import inputs as inputs_mod
from certify import keys
from certify.verify import verify
from core.context import Context
from fetch import provision as provision_mod
from manifests import artifact_sets as artifacts
from manifests import recipe_model as recipes
from patches import stack
from tests.unit.test_certificate import make_certificate, payload_of, reasons, resign, trusted

RECIPE = recipes.load("tiny-llama", {})


def test_artifact_subjects_say_which_digest_provisioning_checked(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = artifacts.load_set(RECIPE.artifacts).variant(RECIPE.variant).files
    vdir = tmp_path / "store" / RECIPE.artifacts / RECIPE.variant
    files = tuple(vdir / e.name for e in entries)  # never hashed: verified_inputs must not claim it did
    provisioned = types.SimpleNamespace(
        variant=RECIPE.variant, files=files, store=vdir, manifest_digest="m" * 64, provenance={}
    )
    patched = types.SimpleNamespace(pristine=types.SimpleNamespace(provenance={}), provenance={}, digest="p")
    monkeypatch.setattr(provision_mod, "provision", lambda *a, **k: provisioned)
    monkeypatch.setattr(stack, "ensure_patched", lambda *a, **k: patched)
    inputs = inputs_mod.verified_inputs(ctx, RECIPE, store=tmp_path / "store")
    assert len(inputs.subjects) == len(entries)
    for s, e in zip(inputs.subjects, entries, strict=True):
        assert s["digest"] == {"sha256": e.sha256, "blake3": e.blake3}
        how = cert.established(s)
        assert set(how) == {"sha256", "blake3"}, s
        assert how["sha256"] == cert.MANIFEST_SHA256 and "not recomputed" in how["sha256"]
        assert how["blake3"] == cert.PROVISIONING_BLAKE3
    assert "the sha256 stated is the manifest's" in inputs.artifacts_line


def test_binaries_are_hashed_now_and_say_so(tmp_path: Path) -> None:
    binary = tmp_path / "dgr-shard-worker"
    binary.write_bytes(b"\x7fELF pretend")
    subjects, _ = inputs_mod._binary_subjects("cpu", {"dgr-shard-worker": binary}, {})
    assert cert.established(subjects[0]) == {"sha256": cert.HASHED_NOW, "blake3": cert.HASHED_NOW}


def test_a_missing_file_names_how_its_sha256_was_signed(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    stmt = payload_of(w.certificate)
    art = next(s for s in stmt["subject"] if s["name"].startswith("artifacts/"))
    how = {"sha256": cert.MANIFEST_SHA256, "blake3": cert.PROVISIONING_BLAKE3}
    art["annotations"] = {cert.ESTABLISHED: how}
    resign(w.certificate, stmt, keys.signing_key(ctx.env, ctx.workspace))
    Path(stmt["predicate"]["local_paths"][art["name"]]).unlink()  # not on this machine
    v = verify(w.certificate, trusted(ctx))
    assert v.ok, reasons(v)
    line = next(ln for ln in v.lines if ln.what == f"subject {art['name']}")
    assert line.status == "skip" and "not recomputed by this run" in line.detail, line


def test_certificates_made_before_the_annotations_still_verify(ctx: Context, tmp_path: Path) -> None:
    w = make_certificate(ctx, tmp_path)
    stmt = payload_of(w.certificate)
    for s in stmt["subject"]:
        s.pop("annotations")
    resign(w.certificate, stmt, keys.signing_key(ctx.env, ctx.workspace))
    v = verify(w.certificate, trusted(ctx))
    assert v.ok, reasons(v)
    assert all(cert.established(s) == {} for s in payload_of(w.certificate)["subject"])
