"""Operators' multi-host use, played on loopback: this test is "the operator" and starts real C++
workers itself (with an identity file from `dgr certify --write-identity`), writes a placement file
and runs `dgr certify --placement-file` through the real CLI.  A matching set certifies (signed PASS,
`dgr verify` ok, the workers still running afterwards: attaching never stops them); a worker carrying
another model's identity, a worker owning another range than the file says, and an address where
nothing listens are refused (exit 2, 2, 6), each naming the worker.  Every worker is stopped by the
test's own launcher at the end."""

from __future__ import annotations

import json
import socket
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.integration.conftest import our_workers
from tests.integration.dgr_cli import certified, run_dgr, user_env, verified
from worker.launcher import WorkerCommand, launch

pytestmark = pytest.mark.slow

ENV = user_env()
RECIPE = "tiny-llama"
# The monolithic reference and the route-change placement must be listed; two-middle and its f16 twin
# share two workers (same ranges), the other placements are left out and must show up as SKIPPED.
GROUPS = {"mono": [(0, 12)], "three-first-middle": [(0, 1), (1, 6), (6, 12)], "two-middle": [(0, 6), (6, 12)]}
LISTED = {
    "mono": "mono",
    "three-first-middle": "three-first-middle",
    "two-middle": "two-middle",
    "two-middle-f16": "two-middle",
}


def _identity(tmp: Path) -> Path:
    path = tmp / "identity.json"
    done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--lane", "cpu", "--write-identity", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "start each stage with: " in done.stdout and "--identity" in done.stdout
    assert "also needs --tls DIR" in done.stdout and "or --insecure" in done.stdout
    doc = json.loads(path.read_text())
    assert doc["kind"] == "dgr.worker-identity" and "run_id" not in json.dumps(doc)
    return path


def _start(stack: ExitStack, cmd: WorkerCommand, stubs, tmp: Path, name: str, ranges) -> list[str]:
    pipe = stack.enter_context(
        launch(
            cmd,
            ranges,
            stubs=stubs,
            evidence=tmp / "operator" / name,
            env=ENV,
            start_timeout=120,
        )
    )
    return [s.address for s in pipe.stages]


def _file(tmp: Path, placements: dict[str, list[tuple[str, tuple[int, int]]]], name: str = "p.json") -> Path:
    doc = {
        "schema_version": 1,
        "recipe": RECIPE,
        "lane": "cpu",
        "placements": {
            p: {"stages": [{"address": a, "layers": list(r)} for a, r in stages]}
            for p, stages in placements.items()
        },
    }
    path = tmp / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_attached_workers_certify_and_mismatches_are_refused(
    tmp_path: Path, worker_command: WorkerCommand, stubs, cpu_build, real_ctx
) -> None:
    from fetch.provision import provision

    v4_model = Path(provision(real_ctx, "tiny-v4").first)
    ident = _identity(tmp_path)
    cmd = WorkerCommand(
        program=worker_command.program,
        model=worker_command.model,
        threads=1,
        ctx_size=256,
        identity=ident,
        lane="cpu",
    )
    with ExitStack() as stack:
        addrs = {g: _start(stack, cmd, stubs, tmp_path, g, r) for g, r in GROUPS.items()}
        listed = {p: list(zip(addrs[g], GROUPS[g], strict=True)) for p, g in LISTED.items()}
        pids_before = sorted(our_workers(cpu_build.worker))
        assert len(pids_before) == 6

        # 1. The operator's set matches: signed PASS, verify ok, the report and predicate say "attached".
        good = _file(tmp_path, listed)
        run = certified(ENV, "--recipe", RECIPE, "--placement-file", str(good))
        verified(ENV, run)  # PASS, or a FAIL only from speed checks a loaded machine missed
        cert, pred = run.certificate, run.predicate
        att = pred["identity"]["attached"]
        assert att["self_reported"] is True and att["binaries_hashed"] is False
        assert sorted(w["address"] for w in att["workers"]) == sorted({a for g in addrs.values() for a in g})
        statuses = {r["name"]: r["status"] for r in pred["results"]}
        assert statuses["placement/twelve-single"] == "SKIPPED"
        assert (
            statuses["staging-parity/two-middle-f16"] == "PASS"
            and statuses["route-change/three-first-middle"] == "PASS"
        )
        html = (cert.parent / "report.html").read_text()
        assert "attached workers" in html and addrs["mono"][0] in html
        assert "binaries live on their hosts and were not hashed here" in html
        # Attaching never stops the operator's workers.
        assert sorted(our_workers(cpu_build.worker)) == pids_before

        # 2. A worker serving another model's identity (another artifact manifest) is refused: exit 2.
        other = json.loads(ident.read_text())
        other["artifacts"]["manifest_digest"] = "0" * 64
        (tmp_path / "other.json").write_text(json.dumps(other))
        bad_cmd = WorkerCommand(
            program=cmd.program,
            model=cmd.model,
            threads=1,
            ctx_size=256,
            identity=tmp_path / "other.json",
            lane="cpu",
        )
        [impostor] = _start(stack, bad_cmd, stubs, tmp_path, "impostor", [(0, 12)])
        f = _file(tmp_path, {**listed, "mono": [(impostor, (0, 12))]}, "other-model.json")
        done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--placement-file", str(f), timeout=600)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"attached worker {impostor} (placement mono, stage 0)" in done.stderr
        assert (
            "artifacts.manifest_digest: expected " in done.stderr and "got 0000000000000000…" in done.stderr
        )

        # 2b. Another model (the synthetic DeepSeek V4, also 12 layers) handed a copy of the right identity
        # file: its shape, as Info reports it, gives it away.
        v4 = WorkerCommand(
            program=cmd.program, model=v4_model, threads=1, ctx_size=256, identity=ident, lane="cpu"
        )
        [disguised] = _start(stack, v4, stubs, tmp_path, "disguised", [(0, 12)])
        f = _file(tmp_path, {**listed, "mono": [(disguised, (0, 12))]}, "disguised.json")
        done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--placement-file", str(f), timeout=600)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"attached worker {disguised} (placement mono, stage 0)" in done.stderr
        assert "architecture: expected llama, got deepseek4" in done.stderr

        # 3. A worker owning another range than the file says: exit 2, naming the field.
        [short] = _start(stack, cmd, stubs, tmp_path, "short", [(0, 5)])
        two = [(short, (0, 6)), listed["two-middle"][1]]
        f = _file(tmp_path, {**listed, "two-middle": two}, "range.json")
        done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--placement-file", str(f), timeout=600)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"attached worker {short} (placement two-middle, stage 0)" in done.stderr
        assert "layers: expected 0:6, got 0:5" in done.stderr

        # 4. Nothing listens at an address: exit 6, naming it.
        nobody = f"127.0.0.1:{_free_port()}"
        f = _file(
            tmp_path, {**listed, "two-middle": [(nobody, (0, 6)), listed["two-middle"][1]]}, "gone.json"
        )
        done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--placement-file", str(f), timeout=600)
        assert done.returncode == 6, done.stdout + done.stderr
        assert f"attached worker {nobody} (placement two-middle, stage 0" in done.stderr
        assert "unreachable" in done.stderr
        assert sorted(set(pids_before) - set(our_workers(cpu_build.worker))) == []
    assert our_workers(cpu_build.worker) == []


def test_attached_workers_over_mutual_tls_are_held_to_their_pinned_certificates(
    tmp_path: Path, worker_command: WorkerCommand, stubs, cpu_build
) -> None:
    """Issue 43: the operator's workers started with --tls, the placement file naming the certifier's
    identity and each stage's certificate: certified over mutual TLS, what each presented recorded; a
    pin that does not match, or a pin with no identity to check it with, is exit 2 naming the stage."""
    from worker import tls, tls_ca

    ca = tmp_path / "ca"
    tls_ca.ensure_ca(ca)
    worker_id = tls_ca.issue(ca, "worker", names=["127.0.0.1"])
    driver_id = tls_ca.issue(ca, "driver", names=["127.0.0.1"])  # the sink is served on loopback too
    # the operator's command line with the host's identity, and the pin its entries take
    printed = run_dgr(
        ENV,
        "certify",
        "--recipe",
        RECIPE,
        "--write-identity",
        str(tmp_path / "id-tls.json"),
        "--worker-tls",
        str(worker_id.cert.parent),
    )
    assert printed.returncode == 0, printed.stdout + printed.stderr
    assert f"--tls {worker_id.cert.parent.resolve()}" in printed.stdout
    assert f'"fingerprint": "{worker_id.fingerprint}"' in printed.stdout
    cmd = WorkerCommand(
        program=worker_command.program,
        model=worker_command.model,
        threads=1,
        ctx_size=256,
        identity=_identity(tmp_path),
        lane="cpu",
        tls=worker_id.cert.parent,
        driver_tls=driver_id,  # the operator's own launcher checks its workers' health over TLS
    )

    def placement_file(name: str, pins: dict[tuple[str, int], str], driver: bool = True) -> Path:
        doc = {
            "schema_version": 1,
            "recipe": RECIPE,
            "lane": "cpu",
            "placements": {
                p: {
                    "stages": [
                        {
                            "address": a,
                            "layers": list(r),
                            "fingerprint": pins.get((p, k), worker_id.fingerprint),
                        }
                        for k, (a, r) in enumerate(stages)
                    ]
                }
                for p, stages in listed.items()
            },
        }
        if driver:
            doc["driver"] = {"tls": str(driver_id.cert.parent.relative_to(tmp_path))}
        (tmp_path / name).write_text(json.dumps(doc, indent=2))
        return tmp_path / name

    with ExitStack() as stack:
        addrs = {g: _start(stack, cmd, stubs, tmp_path, g, r) for g, r in GROUPS.items()}
        listed = {p: list(zip(addrs[g], GROUPS[g], strict=True)) for p, g in LISTED.items()}

        run = certified(ENV, "--recipe", RECIPE, "--placement-file", str(placement_file("tls.json", {})))
        said = verified(ENV, run)
        assert f"transport: attached worker {addrs['mono'][0]} presented {worker_id.fingerprint}" in said
        workers = run.predicate["identity"]["attached"]["workers"]
        assert {w["transport"] for w in workers} == {"mtls"}
        assert {w["tls_fingerprint"] for w in workers} == {worker_id.fingerprint}
        assert all(w["tls_pinned"] for w in workers)
        f32 = {n: p for n, p in _parities(run.predicate).items() if not n.endswith("-f16")}
        assert f32 and all(p["bitwise_logits"] for p in f32.values())

        wrong = placement_file("wrong.json", {("three-first-middle", 1): driver_id.fingerprint})
        done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--placement-file", str(wrong), timeout=600)
        assert done.returncode == 2, done.stdout + done.stderr
        stage = addrs["three-first-middle"][1]
        line = next(ln for ln in done.stderr.splitlines() if "presents TLS certificate" in ln)
        assert f"attached worker {stage} (placement three-first-middle, stage 1)" in line
        assert worker_id.fingerprint in line and f"pins {driver_id.fingerprint}" in line

        unchecked = placement_file("no-driver.json", {}, driver=False)
        done = run_dgr(ENV, "certify", "--recipe", RECIPE, "--placement-file", str(unchecked), timeout=600)
        assert done.returncode == 2 and "pins a TLS certificate but the file names no" in done.stderr
        assert tls.load(driver_id.cert.parent) == driver_id


def _parities(pred: dict) -> dict[str, dict]:
    return {p["name"]: p["parity"] for p in pred["figures"]["placements"] if p["role"] == "under test"}
