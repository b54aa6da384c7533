"""The catalog (issue 45) made from real certifications over the Python fake worker: a PASS, a FAIL and
a certificate altered after signing; held to its schema with jsonschema, signed, verified by
`dgr verify`, and refused once tampered with."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from certify import catalog, keys
from cli.main import main
from core.workspace import PROJECT_ROOT
from tests.unit.certify_fixtures import certify_fake, fake_context, small_recipe_doc

SCHEMA = json.loads((PROJECT_ROOT / "manifests" / "schemas" / "catalog.schema.json").read_text())


@dataclasses.dataclass(frozen=True)
class Made:
    root: Path  # the workspace both certifications signed in
    passed: Any  # certify.run.Written
    failed: Any
    forged: Path  # a copy of the PASS certificate with one figure changed after signing


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("catalog")
    passed = certify_fake(root, small_recipe_doc())
    failed = certify_fake(root, {**small_recipe_doc(decode_tok_s_min=1e9), "name": "tiny-slow"})
    forged = root / "forged" / "certificate.json"
    forged.parent.mkdir()
    envelope = json.loads(passed.certificate.read_text())
    payload = base64.b64decode(envelope["payload"]).replace(b'"two-middle"', b'"two-middlf"')
    envelope["payload"] = base64.b64encode(payload).decode()
    forged.write_text(json.dumps(envelope))
    return Made(root=root, passed=passed, failed=failed, forged=forged)


def _catalog(made: Made) -> tuple[dict[str, Any], list[catalog.Read]]:
    ctx = fake_context(made.root)
    paths = catalog.certificate_paths([made.passed.certificate, made.failed.certificate, made.forged])
    read, refused = catalog.read_all(paths, keys.trusted_keys(ws=ctx.workspace))
    return catalog.build(read, refused), read


def _predicate(written: Any) -> dict[str, Any]:
    envelope = json.loads(written.certificate.read_text())
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


def _placements(written: Any) -> dict[str, Any]:
    return {p["name"]: p for p in _predicate(written)["figures"]["placements"]}


def test_each_placement_under_test_is_an_entry_with_its_stages_and_seams(made: Made) -> None:
    doc, _ = _catalog(made)
    jsonschema.validate({**doc, "signer": {"keyid": "0" * 64, "dev_key": True}}, SCHEMA)
    certified = {e["placement"]: e for e in doc["entries"]}
    assert set(certified) == {"two-middle", "three-first-middle", "twelve-single"}  # mono is the reference
    recorded = _placements(made.passed)
    for name, e in certified.items():
        assert (e["lane"], e["recipe"], e["hardware_class"], e["status"]) == (
            "cpu",
            "tiny-fake",
            "cpu-ci",
            "PASS",
        )
        p = recorded[name]
        assert [s["layers"] for s in e["stages"]] == p["stages"]
        assert [s["weight_bytes"] for s in e["stages"]] == p["weight_bytes"]
        assert [s["kv_bytes"] for s in e["stages"]] == p["kv_bytes"] and all(p["kv_bytes"])
        for s, held in zip(e["stages"], p["kv_held"], strict=True):
            # measured from what each stage held after each prompt (the Session RPC): the fake's plain
            # cache grows by exactly its allocation's bytes per position
            positions = sorted({n for n, _ in held})
            assert len(positions) >= 2 and s["kv_bytes_per_token_from"] == "held"
            assert s["kv_held_between"] == [positions[0], positions[-1]]
            assert s["kv_bytes_per_token"] == s["kv_bytes"] / s["n_ctx"] > 0
        assert [s["compute_s_per_token"] for s in e["stages"]] == p["speed"]["stage_compute_s"]
        assert len(e["seams"]) == len(p["stages"]) - 1
        assert [s["bytes_per_token"] for s in e["seams"]] == p["speed"]["seam_bytes_per_token"]
        assert e["speed"]["decode_tok_s"] == p["speed"]["decode_tok_s"]["median"] > 0
        assert e["certificate"]["run_id"] == made.passed.run_id and e["certificate"]["verdict"] == "PASS"
        ident = _predicate(made.passed)["identity"]
        assert e["identity"]["artifacts"]["manifest_digest"] == ident["artifacts"]["manifest_digest"]
        assert e["identity"]["patch_stack"] == ident["patches"]["digest"]
    assert certified["three-first-middle"]["route_change"]["reprefill_s"] > 0  # the recipe's switch ran there
    assert certified["two-middle"]["route_change"] is None


def test_fails_are_listed_with_their_reasons_and_a_forged_certificate_is_refused(made: Made) -> None:
    doc, read = _catalog(made)
    failed = [e for e in doc["failures"] if e["recipe"] == "tiny-slow"]
    assert {e["placement"] for e in failed} == {"two-middle", "three-first-middle", "twelve-single"}
    assert all(e["status"] == "FAIL" and e["reasons"] for e in failed)
    assert any("decode tok/s" in r for e in failed for r in e["reasons"])
    assert not [e for e in doc["entries"] if e["recipe"] == "tiny-slow"]
    (refused,) = doc["refused"]
    assert refused["path"] == str(made.forged) and "signature" in refused["reason"]
    assert len(read) == 2


def test_the_newest_pass_of_a_placement_is_kept(made: Made) -> None:
    doc, read = _catalog(made)
    (passed,) = [r for r in read if r.predicate["run_id"] == made.passed.run_id]
    later = dataclasses.replace(
        passed, predicate={**passed.predicate, "run_id": "later", "finished": "2999-01-01T00:00:00Z"}
    )
    kept = catalog.build([passed, later], [])
    assert {e["certificate"]["run_id"] for e in kept["entries"]} == {"later"}
    assert len(kept["entries"]) == len([e for e in doc["entries"] if e["recipe"] == "tiny-fake"])


def test_a_placement_whose_parity_gate_did_not_pass_is_not_certified(made: Made) -> None:
    """A SKIPPED staging-parity (attached workers that did not list it) compared nothing."""
    _, read = _catalog(made)
    (passed,) = [r for r in read if r.predicate["run_id"] == made.passed.run_id]
    results = [
        {**r, "status": "SKIPPED"} if r["name"] == "staging-parity/two-middle" else r
        for r in passed.predicate["results"]
    ]
    doc = catalog.build([dataclasses.replace(passed, predicate={**passed.predicate, "results": results})], [])
    assert "two-middle" not in {e["placement"] for e in doc["entries"]}
    (skipped,) = [e for e in doc["failures"] if e["placement"] == "two-middle"]
    assert skipped["reasons"] == ["staging-parity/two-middle is SKIPPED: not compared"]


def test_dgr_catalog_signs_it_dgr_verify_checks_it_and_refuses_it_tampered(
    made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = fake_context(made.root)
    for k, v in ctx.env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "catalog.json"
    folder = tmp_path / "reports"
    for w in (made.passed, made.failed):
        shutil.copytree(w.certificate.parent, folder / w.run_id)
    assert main(["catalog", os.fspath(folder), "--out", os.fspath(out)]) == 0
    said = capsys.readouterr().out
    assert "catalog: 3 certified placements, 3 failures, 0 certificates refused, from 2 certificates" in said
    assert main(["verify", os.fspath(out)]) == 0
    said = capsys.readouterr().out
    assert "verified: catalog of 3 certified placements, 3 failures" in said
    assert said.count("ok   subject certificates/") == 2  # each certificate re-hashed where it was read
    signed = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))
    jsonschema.validate(signed["predicate"], SCHEMA)  # the signed document, signer included
    assert signed["predicateType"] == "https://dgr-certify/catalog/v1"

    envelope = json.loads(out.read_text())
    envelope["payload"] = base64.b64encode(
        base64.b64decode(envelope["payload"]).replace(b'"PASS"', b'"PASs"', 1)
    ).decode()
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(envelope))
    assert main(["verify", os.fspath(tampered)]) == 3
    assert "signature" in capsys.readouterr().err

    (folder / made.passed.run_id / "certificate.json").write_text(made.forged.read_text())  # swapped
    assert main(["verify", os.fspath(out)]) == 3
    assert "sha256 mismatch" in capsys.readouterr().err


def test_no_certificate_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    ctx = fake_context(tmp_path)
    for k, v in ctx.env.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "empty").mkdir()
    assert main(["catalog", os.fspath(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.strip().startswith("dgr: configuration error: no certificate.json under")


@pytest.fixture
def signed(made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> Path:
    """The catalog of both certifications, written by `dgr catalog` in the workspace that signed them."""
    for k, v in fake_context(made.root).env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "catalog.json"
    assert (
        main(
            [
                "catalog",
                os.fspath(made.passed.certificate),
                os.fspath(made.failed.certificate),
                "--out",
                os.fspath(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    return out


def _admit(signed: Path, *args: str) -> int:
    return main(["admit", "--catalog", os.fspath(signed), "--lane", "cpu", *args])


def test_admit_a_certified_split_and_refuse_the_rest_naming_why(made: Made, signed: Path, capsys) -> None:
    two = _placements(made.passed)["two-middle"]
    layers = ",".join(f"{b}:{e}" for b, e in two["stages"])
    digest = _predicate(made.passed)["identity"]["artifacts"]["manifest_digest"]
    fake = ("--recipe", "tiny-fake", "--artifacts-digest", digest)
    spaced = layers.replace(",", " ")

    assert _admit(signed, *fake, "--layers", layers) == 0
    admitted = capsys.readouterr().out
    assert (
        f"admitted --layers: recipe tiny-fake on lane cpu: layers {spaced} are placement two-middle"
        in admitted
    )
    assert admitted.rstrip().endswith("; recipe digest not compared")  # tiny-fake is not in this checkout

    assert _admit(signed, *fake, "--layers", "0:5,5:12") == 5  # a cut of the recipe nobody certified
    err = capsys.readouterr().err
    assert (
        "dgr: not admitted: recipe tiny-fake on lane cpu: layers 0:5 5:12 are a split of this recipe "
        "that was not itself certified; certified: " in err
    )
    assert f"two-middle ({layers.replace(',', ' ')})" in err

    other = "0" * 64  # the same split, other artifacts
    assert _admit(signed, "--recipe", "tiny-fake", "--artifacts-digest", other, "--layers", layers) == 5
    assert f"was certified with artifacts {digest}, this split would load {other}" in capsys.readouterr().err

    assert _admit(signed, *fake, "--layers", "0:5,6:12") == 5
    assert "are not a split of this recipe's 12 layers" in capsys.readouterr().err

    assert _admit(signed, *fake, "--layers", layers, "--hardware-class", "gpu-big") == 5
    assert "hardware class gpu-big: no certified placement in the catalog" in capsys.readouterr().err

    assert _admit(signed, "--recipe", "tiny-slow", "--artifacts-digest", digest, "--layers", layers) == 5
    assert (
        "no certified placement in the catalog (failed: three-first-middle, twelve-single, two-middle)"
        in capsys.readouterr().err
    )

    assert _admit(signed, *fake, "--layers", "0:x") == 2

    # the same split under the recipe it was certified with, and under the recipe once a threshold moved
    certified_under = _predicate(made.passed)["recipe"]["digest"]
    assert _admit(signed, *fake, "--recipe-digest", certified_under, "--layers", layers) == 0
    assert "recipe digest not compared" not in capsys.readouterr().out
    moved = "f" * 64
    assert _admit(signed, *fake, "--recipe-digest", moved, "--layers", layers) == 5
    said = capsys.readouterr().err
    assert f"was certified under recipe digest {certified_under}, the recipe now has {moved}" in said


def test_admit_reads_a_placement_file_and_refuses_an_altered_catalog(
    made: Made, signed: Path, tmp_path: Path, capsys
) -> None:
    two = _placements(made.passed)["two-middle"]["stages"]
    digest = _predicate(made.passed)["identity"]["artifacts"]["manifest_digest"]
    placements = {
        "two-middle": {
            "stages": [{"address": f"127.0.0.1:{7000 + k}", "layers": s} for k, s in enumerate(two)]
        },
        "mine": {
            "stages": [
                {"address": "127.0.0.1:7100", "layers": [0, 3]},
                {"address": "127.0.0.1:7101", "layers": [3, 12]},
            ]
        },
    }
    pf = tmp_path / "placements.json"
    pf.write_text(
        json.dumps({"schema_version": 1, "recipe": "tiny-fake", "lane": "cpu", "placements": placements})
    )
    assert (
        main(
            [
                "admit",
                "--catalog",
                os.fspath(signed),
                "--placement-file",
                os.fspath(pf),
                "--artifacts-digest",
                digest,
            ]
        )
        == 5
    )
    out = capsys.readouterr().out
    assert "admitted two-middle: " in out and "refused  mine: " in out

    envelope = json.loads(signed.read_text())
    envelope["payload"] = base64.b64encode(
        base64.b64decode(envelope["payload"]).replace(b"two-middle", b"two-middlf")
    ).decode()
    altered = tmp_path / "altered.json"
    altered.write_text(json.dumps(envelope))
    assert _admit(altered, "--recipe", "tiny-fake", "--artifacts-digest", digest, "--layers", "0:6,6:12") == 3
    assert (
        main(
            [
                "admit",
                "--catalog",
                os.fspath(made.passed.certificate),
                "--recipe",
                "tiny-fake",
                "--lane",
                "cpu",
                "--layers",
                "0:6,6:12",
            ]
        )
        == 2
    )
    assert "is a certificate, not a catalog" in capsys.readouterr().err


def test_kv_bytes_per_position_are_measured_over_a_span_or_allocated() -> None:
    assert catalog.held_per_position([[10, 1000], [30, 3000], [20, 2000]]) == (100.0, (10, 30))
    # a sliding window: the span is part of the figure
    assert catalog.held_per_position([[8, 800], [64, 1600]]) == (800 / 56, (8, 64))
    assert catalog.held_per_position([[10, 1000], [10, 1000]]) is None  # one length: no slope
    assert catalog.held_per_position([]) is None and catalog.held_per_position(None) is None
    (old,) = catalog.stages({"stages": [[0, 4]], "kv_bytes": [4096], "n_ctx": [64]})  # an older certificate
    assert (old["kv_bytes_per_token"], old["kv_bytes_per_token_from"], old["kv_held_between"]) == (
        64.0,
        "allocated",
        None,
    )


def test_a_certificate_of_the_older_schema_is_refused_naming_it_not_listed_as_failures() -> None:
    """The repository's first lavapipe certificate (schema 1, a signed PASS) holds `parity/` results;
    read as today's, each of its placements would be a FAIL for a gate it never had."""
    evidence = PROJECT_ROOT / "evidence"
    older, newer = evidence / "tiny-llama-vulkan-lavapipe", evidence / "tiny-llama-vulkan-lavapipe-gates"
    trusted = keys.trusted_keys([f / "signing-key.pub.pem" for f in (older, newer)])
    read, refused = catalog.read_all([older / "certificate.json", newer / "certificate.json"], trusted)
    assert [r.path for r in read] == [newer / "certificate.json"]
    (why,) = refused
    assert why["path"] == str(older / "certificate.json")
    assert "schema_version 1" in why["reason"] and "staging-parity" in why["reason"]
    doc = catalog.build(read, refused)
    assert doc["failures"] == [] and {e["lane"] for e in doc["entries"]} == {"vulkan"}
