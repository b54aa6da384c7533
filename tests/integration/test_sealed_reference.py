"""Sealed references on the real CPU build, through the real CLI (issue 21).

tiny-llama: `dgr reference` makes and seals the monolithic run; `dgr certify --reference` provisions it
into an empty store and certifies against it with no monolithic worker (run.json says so), with the very
figures of a live run (bitwise); a copy with one changed byte is exit 3, a reference of another recipe or
another patch stack is exit 2 naming it.  An attached `--placement-file` run (the operator's workers, no
monolithic one listed or started) certifies against the same reference.  gemma3-270m-q4: made, sealed,
provisioned into an empty store, certified: the same figures as its live run.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import GEMMA_SET, GemmaStore, our_workers
from tests.integration.dgr_cli import Certified, load_bound_misses, run_dgr, user_env
from worker.launcher import WorkerCommand, launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # gemma3: a sealed and a live run, ~10 min

ENV = user_env()


def _line(out: str, prefix: str) -> str:
    return next(ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith(prefix))


def _predicate(cert: Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(json.loads(cert.read_text())["payload"]))["predicate"]


def _make(recipe: str, out: Path, *extra: str) -> Path:
    done = run_dgr(ENV, "reference", "--recipe", recipe, "--lane", "cpu", "--out", str(out), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = Path(_line(done.stdout, "manifest: "))
    assert manifest.is_file() and "MiB per 1k positions" in done.stdout
    return manifest


def _certify(recipe: str, *extra: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    done = run_dgr(ENV, "certify", "--recipe", recipe, "--lane", "cpu", *extra)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: a signed FAIL (the callers say which)
    cert = Path(_line(done.stdout, "certificate: "))
    pred = _predicate(cert)
    return cert, pred, json.loads((Path(pred["evidence"]) / "run.json").read_text())


def _parity(pred: dict[str, Any]) -> dict[str, Any]:
    return {p["name"]: p["parity"] for p in pred["figures"]["placements"] if p["role"] == "under test"}


def _same_figures_as_live(recipe: str, manifest: Path, store: Path, live_run: Certified) -> dict[str, Any]:
    """Certify against the sealed reference and hold its figures to the session's live run of the same
    recipe (conftest.live_certification: made once, shared with the certify tests)."""
    cert, pred, record = _certify(recipe, "--reference", str(manifest), "--store", str(store))
    assert (pred["verdict"]["status"] == "PASS") == (not load_bound_misses(pred))  # loaded box: speed only
    assert record["monolithic_worker_started"] is False and record["workers_started"]
    check = run_dgr(ENV, "verify", str(cert), "--store", str(store))
    assert check.returncode == 0, check.stdout + check.stderr
    live, live_record = live_run.predicate, live_run.record
    assert live["recipe"]["name"] == recipe and live_record["monolithic_worker_started"] is True
    assert _parity(pred) == _parity(live)  # the same figures, to the last bit
    assert pred["figures"]["reference_tokens"] == live["figures"]["reference_tokens"]
    assert pred["figures"]["route_change"]["switched"] == live["figures"]["route_change"]["switched"]
    return pred


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama's sealed reference, made once for this module's tests (each only reads it)."""
    return _make("tiny-llama", tmp_path_factory.mktemp("tiny-ref") / "ref")


def test_tiny_llama_sealed_reference_end_to_end(
    tmp_path: Path, cpu_build, live_certification, tiny_reference: Path
) -> None:
    manifest = tiny_reference
    # plain `dgr certify` is tiny-llama on the CPU lane: the run test_certify_e2e checks too
    pred = _same_figures_as_live("tiny-llama", manifest, tmp_path / "empty-store", live_certification())
    assert all(p["bitwise_logits"] for n, p in _parity(pred).items() if not n.endswith("-f16"))
    sha = json.loads(manifest.read_text())["variants"]["f32"]["files"][0]["sha256"]
    assert pred["identity"]["sealed_reference"]["sha256"] == sha

    # One changed byte in a copy served from elsewhere: exit 3, before any worker (nothing started).
    bad = tmp_path / "tampered"
    shutil.copytree(manifest.parent, bad)
    gguf = next(bad.glob("*.gguf"))
    raw = bytearray(gguf.read_bytes())
    raw[len(raw) // 3] ^= 0x04
    gguf.write_bytes(bytes(raw))
    doc = json.loads((bad / manifest.name).read_text())
    doc["origins"] = [{"kind": "local", "path": str(bad)}]
    (bad / manifest.name).write_text(json.dumps(doc))
    before = our_workers(cpu_build.worker)
    done = run_dgr(
        ENV,
        "certify",
        "--recipe",
        "tiny-llama",
        "--reference",
        str(bad / manifest.name),
        "--store",
        str(tmp_path / "store-2"),
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert gguf.name in done.stderr and "verdict" not in done.stdout
    assert our_workers(cpu_build.worker) == before == []

    # Another recipe (one threshold changed: another digest): exit 2 naming the recipe digest.
    doc = json.loads(Path("manifests/recipes/tiny-llama.json").read_text())
    doc["hardware_classes"][0]["staging_parity"]["kl_max_max"] = 2e-7
    other = tmp_path / "tiny-llama.json"
    other.write_text(json.dumps(doc))
    done = run_dgr(ENV, "certify", "--recipe-file", str(other), "--reference", str(manifest))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "another recipe digest" in done.stderr

    # A reference made with another patch stack: exit 2 naming the patch digest.
    from certify import reference, reference_file

    contents = reference_file.read(next(manifest.parent.glob("*.gguf")))
    header = json.loads(json.dumps(contents.header))
    header["identity"]["patches"]["digest"] = "0" * 64
    folder = tmp_path / "other-patches"
    folder.mkdir()
    tensors = [reference_file.Tensor(name=n, array=a) for n, a in contents.tensors.items()]
    _, patched = reference.write_sealed(folder, "ref-other-patches", header, tensors)
    done = run_dgr(
        ENV,
        "certify",
        "--recipe",
        "tiny-llama",
        "--reference",
        str(patched),
        "--store",
        str(tmp_path / "store-3"),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "another patch digest: 0000000000000000…" in done.stderr


def test_attached_placement_file_against_a_sealed_reference(
    tmp_path: Path, worker_command: WorkerCommand, stubs, cpu_build, tiny_reference: Path
) -> None:
    manifest = tiny_reference
    ident = tmp_path / "identity.json"
    done = run_dgr(ENV, "certify", "--recipe", "tiny-llama", "--write-identity", str(ident))
    assert done.returncode == 0, done.stdout + done.stderr
    cmd = WorkerCommand(
        program=worker_command.program,
        model=worker_command.model,
        threads=1,
        ctx_size=256,
        identity=ident,
        lane="cpu",
    )
    groups = {"three-first-middle": [(0, 1), (1, 6), (6, 12)], "two-middle": [(0, 6), (6, 12)]}
    with ExitStack() as stack:
        placements = {}
        for name, ranges in groups.items():
            pipe = stack.enter_context(
                launch(
                    cmd,
                    ranges,
                    stubs=stubs,
                    evidence=tmp_path / "operator" / name,
                    env=ENV,
                    start_timeout=120,
                )
            )
            placements[name] = {
                "stages": [
                    {"address": s.address, "layers": list(r)}
                    for s, r in zip(pipe.stages, ranges, strict=True)
                ]
            }
        pf = tmp_path / "placements.json"
        pf.write_text(
            json.dumps({"schema_version": 1, "recipe": "tiny-llama", "lane": "cpu", "placements": placements})
        )
        cert, pred, record = _certify("tiny-llama", "--placement-file", str(pf), "--reference", str(manifest))
    assert (pred["verdict"]["status"] == "PASS") == (not load_bound_misses(pred))  # loaded box: speed only
    assert record["monolithic_worker_started"] is False and record["workers_started"] == []
    statuses = {r["name"]: r["status"] for r in pred["results"]}
    assert statuses["staging-parity/two-middle"] == "PASS"
    assert statuses["route-change/three-first-middle"] == "PASS"
    assert statuses["placement/four-even"] == "SKIPPED" and "placement/mono" not in statuses
    assert pred["identity"]["attached"]["workers"] and pred["identity"]["sealed_reference"]["set"]
    assert pred["gates"]["sealed_reference"]["gate"] == "staging-parity"
    assert all(p["bitwise_logits"] for p in _parity(pred).values())
    assert our_workers(cpu_build.worker) == []


def test_gemma3_sealed_reference_gives_the_live_figures(
    tmp_path: Path, cpu_build, gemma_store: GemmaStore, gemma_live: Certified
) -> None:
    """Made from, and certified on, the session's gemma store (the model provisioned once); the
    reference itself is provisioned from its sealed origin into that store, which lacks it."""
    store = os.fspath(gemma_store.path)
    manifest = _make(GEMMA_SET, tmp_path / "ref", "--store", store)
    # gemma_live is test_certify_gemma's run
    pred = _same_figures_as_live(GEMMA_SET, manifest, gemma_store.path, gemma_live)
    assert pred["gates"]["staging_parity"]["status"] == "PASS"
