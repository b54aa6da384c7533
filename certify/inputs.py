"""What a certification run is given: the verified inputs (artifacts, source and patch trees), the
lane's build, the worker programs, and the identity chain and subjects the certificate names.

Each piece is verified by its own stage before it is used; this module gathers them (``prepare`` for
workers started here, ``prepare_attached`` for workers an operator runs) and writes the identity file an
attached worker is started with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certify import certificate as cert
from core.canonical import write_json
from core.context import Context
from core.digits import ascii_int
from core.errors import ConfigurationError, IntegrityError
from manifests.recipe_model import Mtp, Recipe
from pipeline.worker_identity import stable_identity


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """Everything the measurement needs, each piece already verified by its own stage."""

    model: Path  # the first split file; the worker finds the others beside it
    mtp_model: Path | None = None  # the MTP-only file the last stage drafts with (--mtp-model)
    worker: tuple[str, ...]  # the lane's worker program (argv prefix)
    reference_worker: tuple[str, ...] | None = None  # the CPU build, for the backend-agreement gate
    identity: Mapping[str, Any] = field(default_factory=dict)
    subjects: Sequence[Mapping[str, Any]] = ()
    local_paths: Mapping[str, str] = field(default_factory=dict)
    verified: Sequence[str] = ()


# Preparation: the real stages (each verifies its own output) ---------------------------------------
def _binary_subjects(
    lane: str, binaries: Mapping[str, Path], recorded: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    subjects, paths = [], {}
    for name, path in sorted(binaries.items()):
        digests = cert.file_digests(Path(path))
        record = recorded.get(name)
        want = record.get("sha256") if isinstance(record, Mapping) else None
        if want and want != digests["sha256"]:
            raise IntegrityError(
                f"{lane} build: {path} changed since it was built (sha256 {digests['sha256']}, "
                f"build provenance says {want})",
                hint=f"run `dgr build --lane {lane}` again",
            )
        subject_name = f"build/{lane}/{Path(path).name}"
        subjects.append(cert.subject(subject_name, digests))
        paths[subject_name] = str(Path(path).resolve())
    return subjects, paths


@dataclass(frozen=True, kw_only=True)
class Verified:
    """What a certification holds true of this machine's inputs, whoever runs the workers."""

    model: Path
    subjects: list[dict[str, Any]]
    paths: dict[str, str]
    identity: dict[str, Any]  # source, patches, artifacts (the build is the caller's)
    artifacts_line: str
    mtp_model: Path | None = None  # the nextn block's MTP-only file (recipe "mtp": {"artifacts": ...})


@dataclass(frozen=True, kw_only=True)
class _Artifacts:
    """One provisioned set as the certificate names it: its files as subjects, and its identity."""

    first: Path
    subjects: list[dict[str, Any]]
    paths: dict[str, str]
    identity: dict[str, Any]
    line: str


def _verified_set(ctx: Context, set_name: str, variant: str | None, *, store: Path | None) -> _Artifacts:
    from fetch.provision import provision
    from lanes.build import fetch_tools
    from manifests.artifact_sets import load_set

    provisioned = provision(ctx, set_name, store=store, variant=variant, tools=fetch_tools(ctx))
    entries = load_set(set_name, env=ctx.env).variant(provisioned.variant).files
    subjects, paths = [], {}
    store_root = provisioned.store.parent.parent  # <store>/<set>/<variant>
    for entry, path in zip(entries, provisioned.files, strict=True):
        # provisioning took only a sealed variant, and the schema seals both digests together
        assert entry.sha256 is not None and entry.blake3 is not None
        # Provisioning checked every file's blake3 against the manifest: no need to hash again.  Its
        # sha256 is the manifest's, never computed here, and the subject says so.
        name = "artifacts/" + Path(os.path.relpath(path, store_root)).as_posix()
        subjects.append(
            cert.subject(
                name,
                {"sha256": entry.sha256, "blake3": entry.blake3},
                established={"blake3": cert.PROVISIONING_BLAKE3, "sha256": cert.MANIFEST_SHA256},
            )
        )
        paths[name] = str(Path(path).resolve())
    identity = {
        "set": set_name,
        "variant": provisioned.variant,
        "manifest_digest": provisioned.manifest_digest,
        **dict(provisioned.provenance),
    }
    line = (
        f"artifacts: {len(provisioned.files)} files of set {set_name} ({provisioned.variant}) verified "
        f"against manifest {provisioned.manifest_digest[:16]}… by provisioning (blake3; the sha256 stated "
        "is the manifest's)"
    )
    return _Artifacts(
        first=Path(provisioned.files[0]), subjects=subjects, paths=paths, identity=identity, line=line
    )


def verified_inputs(ctx: Context, recipe: Recipe, *, store: Path | None) -> Verified:
    """Provision (verify) the recipe's artifacts (and the MTP-only file's set, where the recipe names
    one) and the source/patch trees: the identity chain's machine-independent part, and the artifact
    subjects."""
    from patches.stack import ensure_patched

    main = _verified_set(ctx, recipe.artifacts, recipe.variant, store=store)
    block = recipe.mtp if isinstance(recipe.mtp, Mtp) else None
    mtp_set = block.artifacts if block is not None else None  # the nextn block's own file, if any
    mtp = _verified_set(ctx, mtp_set, block.variant, store=store) if block is not None and mtp_set else None
    patched = ensure_patched(ctx)
    pristine = patched.pristine  # verified by ensure_patched
    identity = {
        "source": {k: v for k, v in dict(pristine.provenance).items() if k != "stamp"},
        "patches": {**dict(patched.provenance), "digest": patched.digest},
        "artifacts": main.identity,
    }
    if mtp is not None:
        identity["mtp_artifacts"] = mtp.identity
    parts = [main] + ([mtp] if mtp else [])
    return Verified(
        model=main.first,
        mtp_model=mtp.first if mtp else None,
        subjects=[s for a in parts for s in a.subjects],
        paths={k: v for a in parts for k, v in a.paths.items()},
        identity=identity,
        artifacts_line="; ".join(a.line for a in parts),
    )


def prepare(
    ctx: Context, recipe: Recipe, lane: str, *, store: Path | None, need_cpu_reference: bool
) -> Prepared:
    from lanes.build import ensure_build

    inputs = verified_inputs(ctx, recipe, store=store)
    build = ensure_build(ctx, lane)
    if build.worker is None:
        raise ConfigurationError(
            f"the {lane} build at {build.dir} has no dgr-shard-worker", hint=f"run `dgr build --lane {lane}`"
        )
    ref_build = ensure_build(ctx, "cpu") if need_cpu_reference and lane != "cpu" else None
    subjects, paths = list(inputs.subjects), dict(inputs.paths)
    for b in (build, ref_build):
        if b is None:
            continue
        s, p = _binary_subjects(b.lane, b.binaries, b.provenance.get("binaries", {}))
        subjects += s
        paths.update(p)
    identity = {
        **inputs.identity,
        "build": {**dict(build.provenance), "key": build.key, "lane": build.lane},
        "reference_build": (
            {**dict(ref_build.provenance), "key": ref_build.key, "lane": ref_build.lane}
            if ref_build
            else None
        ),
    }
    verified = [
        inputs.artifacts_line,
        f"build: {lane} binaries hashed and matched to the build's provenance (key {build.key[:16]}…)",
    ]
    if ref_build is not None:
        verified.append(f"reference build: cpu binaries hashed (key {ref_build.key[:16]}…)")
    return Prepared(
        model=inputs.model,
        mtp_model=inputs.mtp_model,
        worker=(str(build.worker),),
        reference_worker=(str(ref_build.worker),) if ref_build else None,
        identity=identity,
        subjects=subjects,
        local_paths=paths,
        verified=verified,
    )


# The run -------------------------------------------------------------------------------------------
def ctx_size(recipe: Recipe) -> int:
    """Context for the workers: room for the longest prompt (tokens <= bytes + BOS) plus decode."""
    prompt_chars = max(len(t.encode()) for t in recipe.prompts.texts)
    need = max(
        prompt_chars + 2 + recipe.n_decode, recipe.measure.prompt_tokens + recipe.measure.decode_tokens
    )
    return max(256, -(-need // 256) * 256)


def worker_threads(env: Mapping[str, str], cores: int, stages: int = 1) -> int:
    """Threads per worker: the cores shared out among the most stages a placement starts on this host
    (at least one), the same for every worker of the run, the monolithic reference's included;
    ``DGR_WORKER_THREADS`` overrides.

    Why not every core for every worker: ggml computes a graph on an OpenMP team whose threads spin
    between graphs, so the teams of idle stages took the cores from the stage computing. On the 2-core
    VM, tiny-llama at 2 threads per stage (token-only ring) decoded 4 stages at 58.7 and 12 stages at
    19.8 tok/s, against 298.6 and 227.5 at 1 thread (worker/README.md, "Threads"). One count for the
    whole run, because ggml's results can depend on it (tiny-v4's logits differ between 1 thread and
    2): a staged run is bitwise its monolithic reference only at the same count."""
    raw = env.get("DGR_WORKER_THREADS", "").strip()
    if not raw:
        return max(1, cores // max(1, stages))
    threads = ascii_int(raw)
    if threads is None or threads < 1:
        raise ConfigurationError(f"DGR_WORKER_THREADS={raw!r} is not a positive integer")
    return threads


def prepare_attached(ctx: Context, recipe: Recipe, lane: str, *, store: Path | None) -> Prepared:
    """The identity chain and subjects without a local build: the workers' binaries live on their hosts.

    The artifacts are provisioned (verified) here, so the certificate's subjects are files this machine
    verified (each subject says how); source and patch stack come from this checkout's own verified
    trees, since those digests are what every worker's identity is held to.
    """
    inputs = verified_inputs(ctx, recipe, store=store)
    identity = {
        **inputs.identity,
        "build": None,  # on the workers' hosts: see identity.attached.workers[].build (self-reported)
        "reference_build": None,
    }
    verified = [
        inputs.artifacts_line + " on the certifying machine",
        "build: not hashed here; the workers are attached (started by the operator on their hosts), their "
        "identity and owned range were checked through Info (self-reported)",
    ]
    return Prepared(
        model=inputs.model,
        mtp_model=inputs.mtp_model,
        worker=(),
        identity=identity,
        subjects=list(inputs.subjects),
        local_paths=dict(inputs.paths),
        verified=verified,
    )


@dataclass(frozen=True, kw_only=True)
class WorkerLines:
    """The command line an operator starts every attached stage with, and what the last stage adds."""

    every_stage: list[str]
    last_stage_also: list[str]  # MTP on: the last stage drafts (--mtp, or --mtp-model with its file)


def mtp_options(recipe: Recipe, mtp_model: Path | None) -> dict[str, Any]:
    """The WorkerCommand fields MTP sets: with it on, every stage can take back a pass's rejected
    drafts and the last stage drafts (from the main file, or from the block's own)."""
    return {
        "max_rewind": recipe.mtp.draft_tokens if isinstance(recipe.mtp, Mtp) else None,
        "mtp": bool(recipe.mtp),
        "mtp_model": mtp_model,
    }


def worker_lines(recipe: Recipe, lane: str, prepared: Prepared, identity: Path) -> WorkerLines:
    """Model, layers placeholder, the ctx the certifier needs, and with MTP on the rewind every stage
    must allow and the last stage's drafting flag (docs/mtp.md)."""
    from worker.launcher import WorkerCommand

    flags = WorkerCommand(program=(), model=prepared.model, **mtp_options(recipe, prepared.mtp_model))
    every = [
        *prepared.worker,
        "--model",
        str(prepared.model),
        "--layers",
        "BEGIN:END",
        "--listen",
        "HOST:PORT",
        "--ctx",
        str(ctx_size(recipe)),
        "--identity",
        str(Path(identity).resolve()),
        "--lane",
        lane,
        *flags.rewind_args(),
    ]
    return WorkerLines(every_stage=every, last_stage_also=flags.drafting_args())


def write_identity(ctx: Context, recipe: Recipe, lane: str, path: Path, *, store: Path | None) -> WorkerLines:
    """Write the identity file a worker of ``recipe`` on ``lane`` is started with; returns the workers'
    command lines to print."""
    prepared = prepare(ctx, recipe, lane, store=store, need_cpu_reference=False)
    doc = stable_identity(recipe, lane, prepared.identity)
    write_json(Path(path), doc)
    return worker_lines(recipe, lane, prepared, path)
