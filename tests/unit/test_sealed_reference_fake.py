"""Sealed references over the Python fake worker: made, sealed, provisioned into an empty store and
certified against with no monolithic worker (same figures as the live run, bitwise); a changed byte is
exit 3 before any worker; another recipe or patch digest is exit 2 naming it; another build key is held
through backend agreement; other hardware makes the staged/monolithic ratio NOT_APPLICABLE."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path

import pytest

from certify import hardware, keys, reference_file, sealed
from certify.reference import make_from
from certify.run import run_certification
from certify.verify import verify
from core.errors import ConfigurationError, DgrError, IntegrityError
from reports.render import render
from tests.unit.certify_fixtures import fake_context, fake_prepared, recipe_from, small_recipe_doc


def _made(tmp: Path, doc: dict | None = None):
    ctx = fake_context(tmp)
    recipe = recipe_from(tmp, doc or small_recipe_doc())
    made = make_from(ctx, recipe, "cpu", fake_prepared(tmp), out=tmp / "made")
    return ctx, recipe, made


def _by_name(pred: dict) -> dict:
    return {p["name"]: p for p in pred["figures"]["placements"] if p["role"] == "under test"}


def test_certify_against_a_provisioned_sealed_reference_gives_the_live_figures(tmp_path: Path) -> None:
    ctx, recipe, made = _made(tmp_path)
    doc = json.loads(made.manifest.read_text())
    entry = doc["variants"]["f32"]["files"][0]
    assert entry["size"] == made.size and len(entry["sha256"]) == 64 and entry["chunks"]
    store = tmp_path / "empty-store"
    ref = sealed.load(ctx, made.manifest, store=store)
    assert (store / made.set_name / "f32" / made.file.name).is_file()  # provisioned from the local origin
    prepared = fake_prepared(tmp_path)
    from certify.run import _with_sealed  # noqa: PLC2701 - the binding certify() applies

    bound = _with_sealed(prepared, ref, recipe)
    fp = hardware.fingerprint(ctx.env)
    w = run_certification(ctx, recipe, "cpu", bound, sealed=ref, fingerprint=fp, render=render)
    live = run_certification(ctx, recipe, "cpu", prepared, fingerprint=fp, render=render)
    assert w.verdict.passed and live.verdict.passed, w.verdict.reasons
    v = verify(w.certificate, keys.trusted_keys(ws=ctx.workspace))
    assert v.ok, [ln.text() for ln in v.failures]
    pred, live_pred = v.predicate, verify(live.certificate, keys.trusted_keys(ws=ctx.workspace)).predicate
    for name, p in _by_name(pred).items():
        assert p["parity"] == _by_name(live_pred)[name]["parity"]  # the same figures, bitwise
        assert p["parity"]["bitwise_logits"]
    assert pred["identity"]["sealed_reference"]["sha256"] == entry["sha256"]
    statement = json.loads(base64.b64decode(json.loads(w.certificate.read_text())["payload"]))
    assert any(s["name"].startswith(f"artifacts/{made.set_name}/") for s in statement["subject"])
    assert pred["gates"]["staging_parity"]["reference"]["sealed_sha256"] == entry["sha256"]
    assert pred["gates"]["sealed_reference"]["gate"] == "staging-parity"
    assert pred["figures"]["route_change"]["expected_from"] == "sealed reference's monolithic, same switch"
    ratio = [
        r
        for res in pred["results"]
        if res["name"] == "speed/two-middle"
        for r in res["details"]["rows"]
        if r["check"] == "staged/monolithic decode"
    ]
    assert ratio and ratio[0].get("status") != "NOT_APPLICABLE"  # same lane, build and hardware: carried
    record = json.loads((w.evidence / "run.json").read_text())
    assert record["monolithic_worker_started"] is False and record["workers_started"]
    assert json.loads((live.evidence / "run.json").read_text())["monolithic_worker_started"] is True
    page = w.html.read_text()
    assert "Reference used: the sealed reference" in page and made.set_name in page
    assert "no monolithic worker ran" in page


def test_one_changed_byte_is_refused_before_any_worker(tmp_path: Path) -> None:
    ctx, _, made = _made(tmp_path)
    raw = bytearray(made.file.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    made.file.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError) as err:
        sealed.load(ctx, made.manifest, store=tmp_path / "empty")
    assert err.value.exit_code == 3


def test_a_changed_store_copy_is_fetched_again_or_refused(tmp_path: Path) -> None:
    ctx, _, made = _made(tmp_path)
    store = tmp_path / "store"
    ref = sealed.load(ctx, made.manifest, store=store)
    copy = Path(ref.record["store_path"])
    good = copy.read_bytes()

    def flip() -> None:
        st = copy.stat()
        with open(copy, "r+b") as fh:
            fh.seek(st.st_size - 3)
            b = fh.read(1)
            fh.seek(st.st_size - 3)
            fh.write(bytes([b[0] ^ 0x80]))
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))

    flip()
    again = sealed.load(ctx, made.manifest, store=store)  # provisioning re-hashed it and fetched it again
    assert copy.read_bytes() == good and again.record["sha256"] == ref.record["sha256"]
    made.file.unlink()  # the origin is gone: nothing to heal from
    flip()
    with pytest.raises(DgrError) as err:
        sealed.load(ctx, made.manifest, store=store)
    assert err.value.exit_code in (3, 6), err.value


def test_another_recipe_or_patch_digest_is_refused_naming_it(tmp_path: Path) -> None:
    ctx, recipe, made = _made(tmp_path)
    ref = sealed.load(ctx, made.manifest, store=tmp_path / "store")
    doc = small_recipe_doc()
    doc["n_decode"] = 5
    (tmp_path / "other").mkdir()
    other = recipe_from(tmp_path / "other", doc)
    with pytest.raises(ConfigurationError, match="another recipe digest") as err:
        sealed.check_recipe(ref, other)
    assert err.value.exit_code == 2
    prepared = fake_prepared(tmp_path)
    patched = {**prepared.identity, "patches": {"digest": "another-stack"}}
    with pytest.raises(ConfigurationError, match="another patch digest"):
        sealed.check(ref, recipe, patched, [1, 6])
    with pytest.raises(ConfigurationError, match="captured cuts"):
        sealed.check(ref, recipe, prepared.identity, [1, 6, 99])


def test_another_build_is_held_through_backend_agreement(tmp_path: Path) -> None:
    doc = small_recipe_doc()
    doc["hardware_classes"][0]["backend_agreement"] = {
        "top1_margin_min": 0.01,
        "top1_agreement_min": 1.0,
        "kl_mean_max": 1e-6,
        "kl_max_max": 1e-5,
        "logits_nmse_max": 1e-5,
        "boundary_nmse_max": 1e-5,
    }
    ctx, recipe, made = _made(tmp_path, doc)
    ref = sealed.load(ctx, made.manifest, store=tmp_path / "store")
    prepared = fake_prepared(tmp_path)
    prepared = dataclasses.replace(
        prepared, identity={**prepared.identity, "build": {"key": "another-build", "lane": "cpu"}}
    )
    w = run_certification(ctx, recipe, "cpu", prepared, sealed=ref, render=render)
    assert w.verdict.passed, w.verdict.reasons
    pred = verify(w.certificate, keys.trusted_keys(ws=ctx.workspace)).predicate
    names = {r["name"]: r for r in pred["results"]}
    assert names["backend-agreement/two-middle"]["status"] == "PASS"
    assert "staging-parity/two-middle" not in names
    assert pred["gates"]["backend_agreement"]["applies"]
    assert pred["gates"]["staging_parity"]["status"] == "SKIPPED"
    assert "backend-agreement gate applies" in pred["gates"]["sealed_reference"]["why"]
    rows = [
        r for r in names["speed/two-middle"]["details"]["rows"] if r["check"] == "staged/monolithic decode"
    ]
    assert rows[0]["status"] == "NOT_APPLICABLE"
    assert names["speed/mono"]["status"] == "SKIPPED" and "NOT_APPLICABLE" in names["speed/mono"]["reason"]
    assert pred["figures"]["route_change"]["expected_from"] == "uninterrupted"
    page = w.html.read_text()
    assert "NOT_APPLICABLE: the sealed reference" in page and "each staged placement on cpu" in page


def test_other_hardware_makes_the_speed_ratio_not_applicable(tmp_path: Path) -> None:
    ctx, recipe, made = _made(tmp_path)
    ref = sealed.load(ctx, made.manifest, store=tmp_path / "store")
    fp = {**hardware.fingerprint(ctx.env), "cpu_model": "another CPU"}
    mode = ref.mode_for("cpu", "fake-build", fp)
    assert mode.gate == "staging-parity" and not mode.speed_carried and "cpu_model" in mode.speed_reason


def test_another_thread_count_is_named_where_parity_applies(tmp_path: Path) -> None:
    ctx, recipe, made = _made(tmp_path)
    ref = sealed.load(ctx, made.manifest, store=tmp_path / "store")
    fp = hardware.fingerprint(ctx.env)
    (theirs,) = ref.threads
    assert ref.mode_for("cpu", "fake-build", fp, theirs).why.endswith("the recipe's thresholds")
    other = ref.mode_for("cpu", "fake-build", fp, theirs + 1)
    assert other.gate == "staging-parity"
    assert f"its workers ran at {theirs} threads and this run's at {theirs + 1}" in other.why
    assert f"DGR_WORKER_THREADS={theirs} runs at the reference's" in other.why


def test_the_file_keeps_float32_exactly(tmp_path: Path) -> None:
    import numpy as np

    a = (np.arange(12, dtype=np.float32).reshape(3, 4) / np.float32(7)).astype(np.float32)
    header = {
        "kind": reference_file.HEADER_KIND,
        "recipe": {"name": "r", "digest": "a" * 64},
        "placement": "mono",
        "lane": "cpu",
        "n_layer": 2,
        "n_vocab": 4,
        "width": 4,
        "cuts": [1],
        "run_id": "x",
        "made": "t",
        "identity": {
            "source": {"commit": "c", "tree": "t"},
            "patches": {"digest": "p"},
            "artifacts": {"set": "s", "variant": "v", "manifest_digest": "m"},
            "build": {"lane": "cpu", "key": "k"},
        },
        "hardware": {},
        "speed": None,
        "forced": None,
        "route_change": {
            "placement": "mono",
            "switch_at": 1,
            "reprefill_tokens": 2,
            "cache_miss": "MISS",
            "reference": [1, 2],
            "switched": [1, 2],
        },
        "free": {"prompts": [{"prompt": [1, 2], "tokens": [3, 4], "logit_positions": [0, 1, 2]}]},
    }
    path = tmp_path / "r.gguf"
    tensors = [
        reference_file.Tensor(name="free.p0.logits", array=a),
        reference_file.Tensor(name="free.p0.capture.1", array=-a),
    ]
    reference_file.write(path, header, {"lane": "cpu"}, tensors)
    first = path.read_bytes()
    reference_file.write(path, header, {"lane": "cpu"}, tensors)
    assert path.read_bytes() == first  # same inputs, same bytes
    got = reference_file.read(path)
    assert np.array_equal(got.tensors["free.p0.logits"], a) and got.kv["dgr_reference.lane"] == "cpu"
    # A header the schema refuses (a sealed file made by anything but `dgr reference`) is exit 3.
    reference_file.write(path, {**header, "lane": "../cpu"}, {}, tensors)
    with pytest.raises(IntegrityError, match="/lane") as err:
        reference_file.read(path)
    assert err.value.exit_code == 3


def test_a_lane_reference_forced_on_the_cpu_one_compares_without_running_either(tmp_path: Path) -> None:
    from certify import reference

    ctx, recipe, cpu = _made(tmp_path)
    base = sealed.load(ctx, cpu.manifest, store=tmp_path / "store")
    lane = make_from(ctx, recipe, "vulkan", fake_prepared(tmp_path), out=tmp_path / "lane", base=base)
    result = reference.compare(ctx, recipe, cpu.manifest, lane.manifest, store=tmp_path / "store")
    assert result.status.value == "PASS", result.reason
    assert result.name == "backend-agreement/vulkan-vs-cpu"
    assert result.details["figures"]["bitwise_logits"]
    assert result.details["hardware_class"] == "vulkan-software"
    # A lane reference not forced on this CPU reference cannot be scored against it.
    alone = make_from(ctx, recipe, "vulkan", fake_prepared(tmp_path), out=tmp_path / "alone")
    with pytest.raises(ConfigurationError, match="was not teacher-forced on"):
        reference.compare(ctx, recipe, cpu.manifest, alone.manifest, store=tmp_path / "store")


def test_a_carried_monolithic_speed_below_the_floor_says_where_it_was_measured(tmp_path: Path) -> None:
    ctx, strict, made = _made(tmp_path, small_recipe_doc(decode_tok_s_min=1e9))
    ref = sealed.load(ctx, made.manifest, store=tmp_path / "store")
    sealed.check_recipe(ref, strict)
    fp = hardware.fingerprint(ctx.env)
    w = run_certification(
        ctx, strict, "cpu", fake_prepared(tmp_path), sealed=ref, fingerprint=fp, render=render
    )
    mono = next(r for r in w.verdict.reasons if r.startswith("speed/mono:"))
    assert "measured when it was made" in mono and ref.header["run_id"] in mono
