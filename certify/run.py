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
from typing import TYPE_CHECKING, Any

from certify import certificate as cert
from certify import gates, hardware
from certify.inputs import Prepared, ctx_size, mtp_options, prepare, worker_threads
from certify.keys import SigningKey, signing_key
from certify.verdict import Result, Status, Verdict, decide
from core.canonical import atomic_write_bytes, sha256_bytes, write_json
from core.context import Context
from core.environment import worker_cpus, worker_load
from core.errors import ConfigurationError, DgrError, GateFailed, Terminated
from manifests.recipe_model import HardwareClass, Recipe

if TYPE_CHECKING:  # measure pulls in the worker launcher (gRPC); the run imports it when it measures
    from certify.measure import Outcome, Plan
    from certify.sealed import Sealed
    from manifests.placement_file import PlacementFile
    from pipeline.attached import AttachedPipelines

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
    sealed: Sealed | None = None,
) -> Written:
    """Measure, decide, render, sign, write.  Raises GateFailed (exit 5) after writing a FAIL.

    ``sealed``: a sealed reference (certify.sealed, already verified and checked against ``prepared``)
    every placement is compared with instead of a monolithic run; no monolithic worker is started.

    ``placement_file`` (manifests.placement_file.PlacementFile): attach to workers the operator runs instead
    of starting our own; each is checked through Info before it is trusted.  ``fingerprint``: this
    machine's, when the caller has already taken it (else it is taken here, once).  ``certify`` checks
    the lane and takes the machine itself and goes straight to the run (``_run_prepared``).
    """
    recipe.require_lane(lane)
    key = key or signing_key(ctx.env, ctx.workspace)  # a bad DGR_SIGNING_KEY fails before any work
    here = take_machine(ctx, recipe, lane, fingerprint)
    return _run_prepared(
        ctx,
        recipe,
        lane,
        prepared,
        here,
        key,
        render=render,
        placement_file=placement_file,
        sealed=sealed,
        run_id=run_id,
        start_timeout=start_timeout,
        call_deadline=call_deadline,
    )


@dataclass(frozen=True, kw_only=True)
class Machine:
    """This machine as a run sees it: its fingerprint and the recipe's hardware class for it and the
    lane.  Taken once where a run enters and passed down, so the class the plan is built for, the one
    the gates apply and the one the certificate names are the same."""

    fingerprint: Mapping[str, Any]
    hardware_class: HardwareClass

    @property
    def cpu_cores(self) -> int:
        return int(self.fingerprint["cpu_cores"])


def take_machine(
    ctx: Context, recipe: Recipe, lane: str, fingerprint: Mapping[str, Any] | None = None
) -> Machine:
    """This machine's fingerprint (``fingerprint`` when the caller has just taken it) and the first of
    the recipe's hardware classes that fits it and ``lane`` (exit 2 when none does)."""
    fp = dict(fingerprint) if fingerprint is not None else hardware.fingerprint(ctx.env)
    hc = recipe.hardware_class(lane, int(fp["cpu_cores"]), hardware.gpu_names(fp))
    return Machine(fingerprint=fp, hardware_class=hc)


def _run_prepared(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    prepared: Prepared,
    here: Machine,
    key: SigningKey,
    *,
    render: Render,
    placement_file: Any,
    sealed: Sealed | None,
    run_id: str | None = None,
    start_timeout: float = 120.0,
    call_deadline: float = 120.0,
    tls: str | None = None,
) -> Written:
    """The run on a lane, machine and key its entry point has already checked (``certify`` and
    ``run_certification`` each check them once): plan, measure, decide, publish."""
    run = start_run(ctx, recipe, lane, prepared, run_id)
    context = ctx_size(recipe)
    plan = make_plan(
        ctx,
        run,
        here.hardware_class,
        prepared,
        context=context,
        threads=worker_threads(ctx.env, here.cpu_cores, recipe.most_stages),
        start_timeout=start_timeout,
        call_deadline=call_deadline,
        tls=tls,
    )
    if sealed is not None:
        plan = _against_sealed(plan, sealed, prepared, here)
    outcome, attached, device = _measure(run, plan, placement_file, prepared, context)
    done = _finished_run(run, here, outcome, attached, device, prepared)
    return _publish_and_record(ctx, done, key, render)


def start_run(ctx: Context, recipe: Recipe, lane: str, prepared: Prepared, run_id: str | None = None) -> Run:
    """The run's name, clock and evidence folder, with identity.json written there before any worker
    is started (every worker we start is handed it); ``dgr reference`` starts its run the same way."""
    run_id = run_id or new_run_id()
    run = Run(
        recipe=recipe,
        lane=lane,
        run_id=run_id,
        started=time.time(),
        evidence=ctx.workspace.ensure(ctx.workspace.runs / run_id),
    )
    write_run_identity(run, prepared)
    return run


def _against_sealed(plan: Plan, sealed: Sealed, prepared: Prepared, here: Machine) -> Plan:
    """The plan held to a sealed reference: the build key and fingerprint it is given decide which
    gate compares the placements with it (Sealed.mode_for)."""
    build = prepared.identity.get("build") or {}
    return dataclasses.replace(plan, sealed=sealed, build_key=build.get("key"), fingerprint=here.fingerprint)


@dataclass(frozen=True, kw_only=True)
class Run:
    """What names a run while it goes on: the run record (run.json) and the report's path need it."""

    recipe: Recipe
    lane: str
    run_id: str
    started: float
    evidence: Path


def write_run_identity(run: Run, prepared: Prepared) -> None:
    """identity.json in the evidence folder: the run's identity (recipe, lane, run id and the prepared
    inputs'), handed to every worker we start (``--identity``)."""
    write_json(
        run.evidence / "identity.json",
        {
            "recipe": run.recipe.name,
            "recipe_digest": run.recipe.digest,
            "lane": run.lane,
            "run_id": run.run_id,
            **prepared.identity,
        },
    )


WORKER_SESSIONS = 4  # the worker's own --max-sessions default


def sessions_needed(recipe: Recipe) -> int | None:
    """--max-sessions for the workers we start: the most sessions the recipe decodes at once (contexts
    are made on demand, so a larger cap costs nothing until they are used); None: the worker's own."""
    levels = [c for p in recipe.placements.values() for c in recipe.measure.concurrency_levels(p.n_stages)]
    return max(WORKER_SESSIONS, *levels) if levels else None


def tls_options(folder: Path, pass_frames: str = "tls") -> dict[str, Any]:
    """WorkerCommand's TLS fields for workers started over mutual TLS from a CA made in ``folder``, their
    pass ports in ``pass_frames`` ("tls" records, or "mac": authenticated frames)."""
    from worker.tls_ca import loopback

    worker, driver = loopback(folder)
    return {"tls": worker, "driver_tls": driver, "tls_ca": folder, "pass_frames": pass_frames}


def make_plan(
    ctx: Context,
    run: Run,
    hc: HardwareClass,
    prepared: Prepared,
    *,
    context: int,
    threads: int,
    start_timeout: float,
    call_deadline: float,
    tls: str | None = None,
) -> Plan:
    """The measurement plan: the lane's worker (and the CPU reference worker, when the hardware class
    asks for backend agreement), the stubs, and the lane's worker environment over ours.  ``tls``: each
    worker over mutual TLS, a CA made for the run in evidence/tls (a seam fabric's issued as it is made),
    its pass ports in "tls" records or "mac" frames; None: plaintext on loopback."""
    from certify import measure
    from lanes.runtime import worker_environment
    from worker.launcher import WorkerCommand
    from worker.stubs import load as load_stubs

    secure = tls_options(run.evidence / "tls", tls) if tls else {}

    def command(program: tuple[str, ...], worker_lane: str) -> WorkerCommand:
        return WorkerCommand(
            program=program,
            model=prepared.model,
            threads=threads,
            cpus=worker_cpus(ctx.env),
            load=worker_load(ctx.env),
            ctx_size=context,
            max_sessions=sessions_needed(run.recipe),
            identity=run.evidence / "identity.json",
            lane=worker_lane,
            **secure,
            **mtp_options(run.recipe, prepared.mtp_model),
        )

    return measure.Plan(
        recipe=run.recipe,
        lane=run.lane,
        hardware_class=hc,
        worker=command(prepared.worker, run.lane),
        reference_worker=command(prepared.reference_worker, "cpu") if prepared.reference_worker else None,
        stubs=load_stubs(ctx.workspace),
        evidence=run.evidence,
        env={**ctx.env, **worker_environment(run.lane, ctx.env)},
        start_timeout=start_timeout,
        call_deadline=call_deadline,
    )


def _measure(
    run: Run, plan: Plan, placement_file: Any, prepared: Prepared, context: int
) -> tuple[Outcome, AttachedPipelines | None, dict[str, Any] | None]:
    """Attach (when a placement file is given) and measure; returns the outcome, the attached
    pipelines and the device the lane's workers ran on.  Whatever stops it, run.json records how the
    run ended and a DgrError's hint says where the evidence is before the error goes on."""
    from certify import depth, measure, state
    from lanes.runtime import lane_device

    attached, skipped = None, []
    try:
        if placement_file is not None:
            from certify import attach

            plan, attached, skipped = attach.attach_plan(plan, placement_file, prepared.identity, context)
        if attached is not None:
            attached.preflight()  # every listed worker checked before any measurement
            if plan.sealed is not None:
                plan = dataclasses.replace(plan, build_key=attached_build_key(attached))
        if plan.sealed is not None:
            from certify import measure_sealed

            outcome = measure_sealed.run(plan)
        else:
            outcome = measure.run(plan)
        state.prompts_census(plan, outcome)
        depth.run(plan, outcome)
        outcome.results += skipped
        # A GPU lane's workers that fell back to the CPU certify nothing about that lane.
        device = lane_device(run.lane, outcome.figures.get("placements", []))
    except BaseException as exc:
        _unfinished(run, exc)
        if isinstance(exc, DgrError):
            kept = f"nothing was signed; worker logs and the run record are kept in {run.evidence}"
            exc.hint = f"{exc.hint}; {kept}" if exc.hint else kept  # the error's own advice first
        raise
    return outcome, attached, device


@dataclass(frozen=True, kw_only=True)
class FinishedRun:
    """A run measured and decided: everything its certificate states, gathered once where the run
    ends and handed whole to ``publish`` (which signs it) and ``_predicate`` (which writes it out)."""

    run: Run
    hardware_class: HardwareClass
    finished: float
    results: Sequence[Result]
    figures: Mapping[str, Any]
    fingerprint: Mapping[str, Any]  # the machine's, with the lane's device when it is known
    prepared: Prepared  # with the attached workers' record in its identity when there were some
    verdict: Verdict


def _finished_run(
    run: Run,
    here: Machine,
    outcome: Outcome,
    attached: AttachedPipelines | None,
    device: Mapping[str, Any] | None,
    prepared: Prepared,
) -> FinishedRun:
    """The verdict on the outcome, with the machine's fingerprint (and the lane's device) and the
    attached workers' record folded in, so the certificate says where and on whose workers it ran."""
    finished = time.time()
    fp = here.fingerprint
    if device is not None:
        fp = {**fp, "lane_device": device}  # e.g. marks lavapipe as a software rasterizer
    verdict = decide(outcome.results)
    if attached is not None:
        identity = {**prepared.identity, "attached": attached.record()}
        prepared = dataclasses.replace(prepared, identity=identity)
    return FinishedRun(
        run=run,
        hardware_class=here.hardware_class,
        finished=finished,
        results=outcome.results,
        figures=outcome.figures,
        fingerprint=fp,
        prepared=prepared,
        verdict=verdict,
    )


def _publish_and_record(ctx: Context, done: FinishedRun, key: SigningKey, render: Render) -> Written:
    """The verdict signed and written; run.json then says where, or how signing broke."""
    run = done.run
    try:
        written = publish(ctx, done, key=key, render=render)
    except BaseException as exc:
        _unfinished(run, exc, unsigned_verdict=done.verdict.status.value)
        raise
    sealed = (done.figures.get("sealed_reference") or {}).get("sha256")
    _run_record(
        run,
        done.verdict.status,
        certificate=str(written.certificate),
        html=str(written.html),
        seconds=written.seconds,
        sealed_reference=sealed,
    )
    return written


def _unfinished(run: Run, exc: BaseException, **more: Any) -> None:
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
    _run_record(run, Status.ERROR, error=error, started=_utc(run.started), finished=_utc(time.time()), **more)


def _run_record(run: Run, status: Status, **more: Any) -> None:
    """``run.json`` in the evidence folder: how the run ended, signed or not."""
    record = {
        "run_id": run.run_id,
        "status": status.value,
        "recipe": run.recipe.name,
        "lane": run.lane,
        **workers_started(run.evidence, run.recipe.n_layer),
    }
    write_json(run.evidence / "run.json", {**record, **more})


def workers_started(evidence: Path, n_layer: int) -> dict[str, Any]:
    """The workers this run started, from the launcher's own evidence (one folder per launch, one log
    per stage, ``stage-K-layers-A-B.stdout``), and whether any of them was a monolithic one (a single
    worker owning every layer).  Attached workers are not started here and do not appear."""
    launches = []
    for folder in sorted(p for p in evidence.iterdir() if p.is_dir()) if evidence.is_dir() else ():
        stages = sorted(f.name.removesuffix(".stdout") for f in folder.glob("stage-*-layers-*.stdout"))
        if stages:
            launches.append({"launch": folder.name, "stages": stages})
    mono = f"stage-0-layers-0-{n_layer}"
    return {
        "workers_started": launches,
        "monolithic_worker_started": any(mono in item["stages"] for item in launches),
    }


def attached_build_key(attached: AttachedPipelines) -> str | None:
    """The build key every attached worker reports (self-reported, from its identity file); None when
    they report none or disagree (a sealed reference is then held through backend agreement)."""
    keys = {(w.get("build") or {}).get("key") for w in attached.record()["workers"]}
    return keys.pop() if len(keys) == 1 else None


def publish(ctx: Context, done: FinishedRun, *, key: SigningKey, render: Render) -> Written:
    """Render the page, put its digest in the predicate, sign, write both; never sign an ERROR."""
    if done.verdict.status is Status.ERROR:
        raise ValueError("an incomplete run is never signed")
    signer = _signer(key)
    stmt = cert.statement(done.prepared.subjects, _predicate(done, signer))
    html = render(stmt, signer=signer).encode("utf-8")
    stmt["predicate"]["report"] = {"file": REPORT_FILE, "html_sha256": sha256_bytes(html)}
    envelope = cert.sign(stmt, key)
    run = done.run
    out = ctx.workspace.ensure(ctx.workspace.reports / run.recipe.name / run.lane / run.run_id)
    _write_published(out, html, envelope)
    return Written(
        run_id=run.run_id,
        verdict=done.verdict,
        certificate=(out / CERTIFICATE_FILE).resolve(),
        html=(out / REPORT_FILE).resolve(),
        evidence=run.evidence,
        seconds=round(done.finished - run.started, 3),
    )


def _signer(key: SigningKey) -> dict[str, Any]:
    """Who signs: the key's id, whether it is the development key, and where its public half is; the
    predicate and the report both name it."""
    return {
        "keyid": key.keyid,
        "dev_key": key.dev_key,
        "public_key_path": str(key.public_path) if key.public_path else None,
    }


def _predicate(done: FinishedRun, signer: Mapping[str, Any]) -> dict[str, Any]:
    """What the certificate states about the run (the report's digest is added once it is rendered)."""
    run, prepared = done.run, done.prepared
    return {
        "schema_version": cert.PREDICATE_SCHEMA_VERSION,
        "run_id": run.run_id,
        "started": _utc(run.started),
        "finished": _utc(done.finished),
        "duration_s": round(done.finished - run.started, 3),
        "lane": run.lane,
        "recipe": _recipe_record(run.recipe, done.hardware_class),
        "identity": dict(prepared.identity),
        "hardware": dict(done.fingerprint),
        "results": [r.as_dict() for r in done.results],
        "gates": gates.sections(done.results, done.figures),
        "figures": dict(done.figures),
        "verdict": done.verdict.as_dict(),
        "signer": signer,
        "verified_during_run": list(prepared.verified),
        "local_paths": dict(prepared.local_paths),
        "evidence": str(run.evidence),
    }


def _recipe_record(recipe: Recipe, hc: HardwareClass) -> dict[str, Any]:
    """The recipe as certified: its digest and the hardware class's thresholds the gates applied."""
    return {
        "name": recipe.name,
        "digest": recipe.digest,
        "hardware_class": hc.name,
        "thresholds": {
            "hardware_class": hc.name,
            **next(c for c in recipe.thresholds() if c["name"] == hc.name),
        },
    }


def _write_published(out: Path, html: bytes, envelope: Mapping[str, Any]) -> None:
    """The page and the certificate, each written atomically and left world-readable."""
    atomic_write_bytes(out / REPORT_FILE, html)
    cert.write(out / CERTIFICATE_FILE, envelope)
    for published in (out / REPORT_FILE, out / CERTIFICATE_FILE):
        published.chmod(0o644)  # evidence for reviewers (the temp file it was renamed from was private)


def certify(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    *,
    render: Render,
    store: Path | None = None,
    placement_file: Path | None = None,
    reference: Path | None = None,
    tls: str | None = None,
) -> Written:
    """The whole pipeline for one (recipe, lane); the caller turns a FAIL verdict into exit 5.

    ``tls``: the workers it starts run mutual TLS on every port, their pass ports in "tls" records or
    "mac" frames (make_plan); attached workers take the placement file's identity instead, so the two do
    not go together (exit 2).

    ``reference``: a sealed reference's manifest (``dgr reference`` made it); it is provisioned and
    verified (exit 3 on any changed byte) and held to this run's identity (exit 2 naming the field)
    before any worker starts, and no monolithic worker is started."""
    recipe.require_lane(lane)
    if tls and placement_file is not None:
        raise ConfigurationError(
            "--tls starts the certifier's own workers over TLS; attached workers are reached with the "
            'placement file\'s "driver": {"tls": DIR} (docs/multi-host.md)'
        )
    from manifests.artifact_sets import load_set, require_sealed

    # Cheap refusals first, in the order a user fixes them: artifacts, machine, key.
    require_sealed(load_set(recipe.artifacts, env=ctx.env), recipe.variant)
    here = take_machine(ctx, recipe, lane)
    key = signing_key(ctx.env, ctx.workspace)  # fail early on a bad key, before provisioning or building
    sealed = _load_reference(ctx, recipe, reference, store)
    prepared, pf = _prepare_inputs(
        ctx, recipe, lane, here, store=store, placement_file=placement_file, sealed=sealed
    )
    if sealed is not None:
        prepared = _with_sealed(prepared, sealed, recipe)
    return _run_prepared(
        ctx, recipe, lane, prepared, here, key, render=render, placement_file=pf, sealed=sealed, tls=tls
    )


def _load_reference(
    ctx: Context, recipe: Recipe, reference: Path | None, store: Path | None
) -> Sealed | None:
    """The sealed reference, provisioned and hashed (exit 3 on a changed byte) and held to this recipe
    (exit 2) before anything of the run's own is provisioned or built; None without one."""
    if reference is None:
        return None
    from certify import sealed as sealed_ref

    sealed = sealed_ref.load(ctx, reference, store=store)
    sealed_ref.check_recipe(sealed, recipe)
    return sealed


def _prepare_inputs(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    here: Machine,
    *,
    store: Path | None,
    placement_file: Path | None,
    sealed: Sealed | None,
) -> tuple[Prepared, PlacementFile | None]:
    """The run's inputs.  With a placement file: the file, held to the recipe before anything is
    provisioned, and the artifacts alone (the operator runs the workers).  Without: the artifacts and
    the lane's build, and the CPU reference's build when the class compares the lane with one and no
    sealed reference stands in for it."""
    cross_lane = here.hardware_class.agreement_for(lane) is not None
    if placement_file is None:
        need_cpu = cross_lane and sealed is None
        return prepare(ctx, recipe, lane, store=store, need_cpu_reference=need_cpu), None
    from certify import attach
    from certify.inputs import prepare_attached
    from manifests.placement_file import load_file

    pf = load_file(placement_file)
    attach.restrict(pf, recipe, lane, cross_lane=cross_lane, sealed=sealed is not None)
    return prepare_attached(ctx, recipe, lane, store=store), pf


def _with_sealed(prepared: Prepared, sealed: Sealed, recipe: Recipe) -> Prepared:
    """The inputs with the sealed reference bound in: held to their identity (exit 2 naming the field),
    then its file as a subject, its identity and digests in the identity chain, a verified line."""
    from certify import sealed as sealed_ref

    cuts = sorted({c for p in recipe.placements.values() for c in p.cuts})
    sealed_ref.check(sealed, recipe, prepared.identity, cuts)
    rec = dict(sealed.record)
    name = f"artifacts/{rec['set']}/{Path(rec['store_path']).parent.name}/{rec['file']}"
    subject = cert.subject(name, {"sha256": rec["sha256"], "blake3": rec["blake3"]})  # hashed by sealed.load
    line = (
        f"sealed reference: {rec['file']} of set {rec['set']} provisioned and hashed (sha256 + blake3) "
        f"against manifest {rec['manifest_digest'][:16]}…; made on lane {rec['lane']} "
        f"({rec['made']}, run {rec['made_run_id']}); recipe, patch, source and artifact digests match"
    )
    return dataclasses.replace(
        prepared,
        identity={
            **prepared.identity,
            "sealed_reference": {k: v for k, v in rec.items() if k != "store_path"},
        },
        subjects=[*prepared.subjects, subject],
        local_paths={**prepared.local_paths, name: rec["store_path"]},
        verified=[*prepared.verified, line],
    )


def gate_failed(written: Written) -> GateFailed:
    reasons = written.verdict.reasons
    more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return GateFailed(
        f"verdict {written.verdict.status.value}: " + "; ".join(reasons[:3]) + more,
        hint=f"the signed FAIL certificate is {written.certificate}",
    )
