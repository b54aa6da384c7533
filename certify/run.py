"""`dgr certify`: provision -> build -> workers per placement -> gates -> verdict -> HTML -> certificate.

A PASS or FAIL verdict is rendered, signed and written under
``.work/reports/<recipe>/<lane>/<run-id>/`` (certificate.json = the DSSE envelope, report.html).
A run that cannot finish (a worker died, hung or answered with the wrong shape) signs nothing:
the error names the stage, every worker is stopped by the launcher, and the evidence stays in
``.work/runs/<run-id>/``.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certify import certificate as cert
from certify import gates, hardware
from certify.inputs import Prepared, ctx_size, prepare, worker_threads
from certify.keys import SigningKey, signing_key
from certify.verdict import Result, Status, Verdict, decide
from core.canonical import atomic_write_bytes, sha256_bytes, write_json
from core.context import Context
from core.errors import DgrError, GateFailed, Terminated
from manifests.recipe_model import HardwareClass, Recipe

REPORT_FILE = "report.html"
CERTIFICATE_FILE = "certificate.json"

Render = Callable[..., str]
"""``render(statement, signer=...) -> html``: the report page of a statement about to be signed. The CLI
passes ``reports.render.render`` down; certify never imports the renderer, which sits above it."""


@dataclass(frozen=True, kw_only=True)
class Written:
    run_id: str
    verdict: Verdict
    certificate: Path
    html: Path
    evidence: Path
    seconds: float


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def run_certification(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    prepared: Prepared,
    *,
    key: SigningKey | None = None,
    run_id: str | None = None,
    start_timeout: float = 120.0,
    call_deadline: float = 120.0,
    placement_file: Any = None,
    fingerprint: Mapping[str, Any] | None = None,
    render: Render,
) -> Written:
    """Measure, decide, render, sign, write.  Raises GateFailed (exit 5) after writing a FAIL.

    ``placement_file`` (manifests.placement_file.PlacementFile): attach to workers the operator runs instead
    of starting our own; each is checked through Info before it is trusted.  ``fingerprint``: this
    machine's, when the caller has just taken it (``certify`` does, to pick the hardware class).
    """
    from certify import measure
    from lanes.runtime import lane_device, worker_environment
    from worker.launcher import WorkerCommand
    from worker.stubs import load as load_stubs

    recipe.require_lane(lane)
    key = key or signing_key(ctx.env, ctx.workspace)  # a bad DGR_SIGNING_KEY fails before any work
    run_id = run_id or new_run_id()
    started = time.time()
    fp = dict(fingerprint) if fingerprint is not None else hardware.fingerprint(ctx.env)
    hc = recipe.hardware_class(lane, int(fp["cpu_cores"]), hardware.gpu_names(fp))
    evidence = ctx.workspace.ensure(ctx.workspace.runs / run_id)
    write_json(
        evidence / "identity.json",
        {
            "recipe": recipe.name,
            "recipe_digest": recipe.digest,
            "lane": lane,
            "run_id": run_id,
            **prepared.identity,
        },
    )
    context = ctx_size(recipe)
    threads = worker_threads(ctx.env, int(fp["cpu_cores"]))

    def command(program: tuple[str, ...], worker_lane: str) -> WorkerCommand:
        return WorkerCommand(
            program=program,
            model=prepared.model,
            threads=threads,
            ctx_size=context,
            identity=evidence / "identity.json",
            lane=worker_lane,
        )

    plan = measure.Plan(
        recipe=recipe,
        lane=lane,
        hardware_class=hc,
        worker=command(prepared.worker, lane),
        reference_worker=command(prepared.reference_worker, "cpu") if prepared.reference_worker else None,
        stubs=load_stubs(ctx.workspace),
        evidence=evidence,
        env={**ctx.env, **worker_environment(lane, ctx.env)},
        start_timeout=start_timeout,
        call_deadline=call_deadline,
    )
    attached, skipped = None, []
    try:
        if placement_file is not None:
            from certify import attach

            plan, attached, skipped = attach.attach_plan(plan, placement_file, prepared.identity, context)
        if attached is not None:
            attached.preflight()  # every listed worker checked before any measurement
        outcome = measure.run(plan)
        outcome.results += skipped
        # A GPU lane's workers that fell back to the CPU certify nothing about that lane.
        device = lane_device(lane, outcome.figures.get("placements", []))
    except BaseException as exc:
        _unfinished(evidence, run_id, recipe, lane, exc, started)
        if isinstance(exc, DgrError):
            kept = f"nothing was signed; worker logs and the run record are kept in {evidence}"
            exc.hint = f"{exc.hint}; {kept}" if exc.hint else kept  # the error's own advice first
        raise
    finished = time.time()
    if device is not None:
        fp = {**fp, "lane_device": device}  # e.g. marks lavapipe as a software rasterizer
    verdict = decide(outcome.results)
    if attached is not None:
        identity = {**prepared.identity, "attached": attached.record()}
        prepared = dataclasses.replace(prepared, identity=identity)
    try:
        written = publish(
            ctx,
            recipe=recipe,
            lane=lane,
            hc=hc,
            run_id=run_id,
            started=started,
            finished=finished,
            results=outcome.results,
            figures=outcome.figures,
            fingerprint=fp,
            prepared=prepared,
            key=key,
            verdict=verdict,
            evidence=evidence,
            render=render,
        )
    except BaseException as exc:
        _unfinished(evidence, run_id, recipe, lane, exc, started, unsigned_verdict=verdict.status.value)
        raise
    _run_record(evidence, run_id, recipe, lane, verdict.status, certificate=str(written.certificate),
                html=str(written.html), seconds=written.seconds)
    return written


def _unfinished(
    evidence: Path, run_id: str, recipe: Recipe, lane: str, exc: BaseException, started: float, **more: Any
) -> None:
    """``run.json`` for a run that did not finish, whatever ended it: a DgrError, SIGTERM (Terminated),
    ^C or a bug; the exception then goes on to the caller."""
    if isinstance(exc, DgrError):
        error = exc.one_line()
    elif isinstance(exc, Terminated):
        error = "terminated by SIGTERM before the run finished"
    elif isinstance(exc, KeyboardInterrupt):
        error = "interrupted (SIGINT) before the run finished"
    else:
        error = f"unexpected {type(exc).__name__}: {exc}"
    _run_record(evidence, run_id, recipe, lane, Status.ERROR, error=error, started=_utc(started),
                finished=_utc(time.time()), **more)


def _run_record(evidence: Path, run_id: str, recipe: Recipe, lane: str, status: Status, **more: Any) -> None:
    """``run.json`` in the evidence folder: how the run ended, signed or not."""
    write_json(evidence / "run.json",
               {"run_id": run_id, "status": status.value, "recipe": recipe.name, "lane": lane, **more})


def publish(
    ctx: Context,
    *,
    recipe: Recipe,
    lane: str,
    hc: HardwareClass,
    run_id: str,
    started: float,
    finished: float,
    results: Sequence[Result],
    figures: Mapping[str, Any],
    fingerprint: Mapping[str, Any],
    prepared: Prepared,
    key: SigningKey,
    verdict: Verdict,
    evidence: Path,
    render: Render,
) -> Written:
    """Render the page, put its digest in the predicate, sign, write both; never sign an ERROR."""
    if verdict.status is Status.ERROR:
        raise ValueError("an incomplete run is never signed")
    signer = {
        "keyid": key.keyid,
        "dev_key": key.dev_key,
        "public_key_path": str(key.public_path) if key.public_path else None,
    }
    predicate: dict[str, Any] = {
        "schema_version": cert.PREDICATE_SCHEMA_VERSION,
        "run_id": run_id,
        "started": _utc(started),
        "finished": _utc(finished),
        "duration_s": round(finished - started, 3),
        "lane": lane,
        "recipe": {
            "name": recipe.name,
            "digest": recipe.digest,
            "hardware_class": hc.name,
            "thresholds": {
                "hardware_class": hc.name,
                **next(c for c in recipe.thresholds() if c["name"] == hc.name),
            },
        },
        "identity": dict(prepared.identity),
        "hardware": dict(fingerprint),
        "results": [r.as_dict() for r in results],
        "gates": gates.sections(results, figures),
        "figures": dict(figures),
        "verdict": verdict.as_dict(),
        "signer": signer,
        "verified_during_run": list(prepared.verified),
        "local_paths": dict(prepared.local_paths),
        "evidence": str(evidence),
    }
    stmt = cert.statement(prepared.subjects, predicate)
    html = render(stmt, signer=signer).encode("utf-8")
    stmt["predicate"]["report"] = {"file": REPORT_FILE, "html_sha256": sha256_bytes(html)}
    envelope = cert.sign(stmt, key)
    out = ctx.workspace.ensure(ctx.workspace.reports / recipe.name / lane / run_id)
    atomic_write_bytes(out / REPORT_FILE, html)
    cert.write(out / CERTIFICATE_FILE, envelope)
    for published in (out / REPORT_FILE, out / CERTIFICATE_FILE):
        published.chmod(0o644)  # evidence for reviewers (the temp file it was renamed from was private)
    return Written(
        run_id=run_id,
        verdict=verdict,
        certificate=(out / CERTIFICATE_FILE).resolve(),
        html=(out / REPORT_FILE).resolve(),
        evidence=evidence,
        seconds=round(finished - started, 3),
    )


def certify(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    *,
    render: Render,
    store: Path | None = None,
    placement_file: Path | None = None,
) -> Written:
    """The whole pipeline for one (recipe, lane); the caller turns a FAIL verdict into exit 5."""
    recipe.require_lane(lane)
    from manifests.artifact_sets import load_set, require_sealed

    # Cheap refusals first, in the order a user fixes them: artifacts, machine, key.
    require_sealed(load_set(recipe.artifacts), recipe.variant)
    fp = hardware.fingerprint(ctx.env)
    hc = recipe.hardware_class(lane, int(fp["cpu_cores"]), hardware.gpu_names(fp))
    key = signing_key(ctx.env, ctx.workspace)  # fail early on a bad key, before provisioning or building
    if placement_file is not None:
        from certify import attach
        from certify.inputs import prepare_attached
        from manifests.placement_file import load_file

        pf = load_file(placement_file)
        attach.restrict(pf, recipe, lane, cross_lane=hc.agreement_for(lane) is not None)
        prepared = prepare_attached(ctx, recipe, lane, store=store)
        return run_certification(ctx, recipe, lane, prepared, key=key, placement_file=pf, fingerprint=fp,
                                 render=render)
    prepared = prepare(ctx, recipe, lane, store=store, need_cpu_reference=hc.agreement_for(lane) is not None)
    return run_certification(ctx, recipe, lane, prepared, key=key, fingerprint=fp, render=render)


def gate_failed(written: Written) -> GateFailed:
    reasons = written.verdict.reasons
    more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return GateFailed(
        f"verdict {written.verdict.status.value}: " + "; ".join(reasons[:3]) + more,
        hint=f"the signed FAIL certificate is {written.certificate}",
    )
