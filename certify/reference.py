"""`dgr reference`: make a sealed reference (the recipe's monolithic run, stored once) and compare two.

``make`` runs the recipe's monolithic placement on one lane (on any machine that holds the model),
free-running greedy with the residual captured at every cut the recipe's placements use, its speed
and its route change, and writes them with the run's identity chain into one file
(certify.reference_file).  It is then sealed like any artifact set: a manifest ``<set>.json`` beside
it (schema artifact-set, a ``local`` origin naming the folder it was made in; copy the file anywhere
and add an origin to serve it from there) with size, sha256, blake3 and per-chunk blake3, written by
``dgr seal``'s own code.  ``dgr certify --reference <set>.json`` provisions and verifies it.

With ``against`` (a sealed CPU reference of the same recipe), the lane's run is also teacher-forced on
that reference's tokens, so ``compare`` can score the two through the backend-agreement gate later
without running either again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from certify import gates, hardware, reference_file
from certify import sealed as sealed_ref
from certify.inputs import Prepared, ctx_size, prepare, worker_threads
from certify.run import Run, make_plan, start_run, take_machine
from certify.verdict import Result
from core.canonical import write_json
from core.context import Context
from core.errors import ConfigurationError
from manifests.recipe_model import Recipe
from pipeline import drive

if TYPE_CHECKING:  # measure pulls in the worker launcher (gRPC); a reference run imports it when it runs
    from certify.measure import Plan, Reference

CHUNK_SIZE = 4 << 20
PLAN_TIMEOUT_S = 120.0


@dataclass(frozen=True, kw_only=True)
class Made:
    set_name: str
    file: Path
    manifest: Path
    size: int
    positions: int  # logits rows stored (all prompts, free-running)
    seconds: float  # the monolithic run
    seal_seconds: float
    evidence: Path


def make(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    *,
    store: Path | None,
    out: Path | None = None,
    against: Path | None = None,
) -> Made:
    """Run the recipe's monolithic reference on ``lane``, write it, seal it; returns where it went."""
    recipe.require_lane(lane)
    base = None
    if against is not None:
        base = sealed_ref.load(ctx, against, store=store)
        sealed_ref.check_recipe(base, recipe)
        if base.lane != "cpu":
            raise ConfigurationError(
                f"--against {against}: a reference of lane {base.lane}; teacher forcing "
                "is on the CPU reference's tokens"
            )
    prepared = prepare(ctx, recipe, lane, store=store, need_cpu_reference=False)
    return make_from(ctx, recipe, lane, prepared, out=out, base=base)


def make_from(
    ctx: Context,
    recipe: Recipe,
    lane: str,
    prepared: Prepared,
    *,
    out: Path | None = None,
    base: sealed_ref.Sealed | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    start_timeout: float = PLAN_TIMEOUT_S,
) -> Made:
    """``make`` on inputs already prepared (verified artifacts, the lane's build)."""
    here = take_machine(ctx, recipe, lane, fingerprint)
    cuts = sorted({c for p in recipe.placements.values() for c in p.cuts})
    if base is not None:
        sealed_ref.check(base, recipe, prepared.identity, cuts)
    run = start_run(ctx, recipe, lane, prepared)
    plan = make_plan(
        ctx,
        run,
        here.hardware_class,
        prepared,
        context=ctx_size(recipe),
        threads=worker_threads(ctx.env, here.cpu_cores, recipe.most_stages),
        start_timeout=start_timeout,
        call_deadline=PLAN_TIMEOUT_S,
    )
    made = _run_monolithic(plan, run, prepared, here.fingerprint, cuts, base)
    return _store(ctx, made, out)


@dataclass(frozen=True, kw_only=True)
class _MonolithicRun:
    """The recipe's monolithic run as ``dgr reference`` made it, gathered once: the reference file's
    header, its tensors and the run record are all written from this one value."""

    run: Run
    prepared: Prepared
    fingerprint: Mapping[str, Any]
    cuts: list[int]
    ref: Reference  # the trace (and teacher-forced trace), speed and route change
    record: Mapping[str, Any]  # the monolithic placement's record (its workers' devices and threads)
    seconds: float
    base: sealed_ref.Sealed | None  # the CPU reference it was teacher-forced on


def _run_monolithic(
    plan: Plan,
    run: Run,
    prepared: Prepared,
    fingerprint: Mapping[str, Any],
    cuts: list[int],
    base: sealed_ref.Sealed | None,
) -> _MonolithicRun:
    """The lane's monolithic worker run once, timed: free-running with every cut captured, and
    teacher-forced on ``base``'s tokens when there is one (so ``compare`` can score the two later)."""
    from certify import measure

    t0 = time.perf_counter()
    ref, record = measure.lane_monolithic(
        plan,
        cuts,
        prompts=base.prompts if base else None,
        continuations=[list(p.tokens) for p in base.trace.prompts] if base else None,
    )
    seconds = time.perf_counter() - t0
    return _MonolithicRun(
        run=run,
        prepared=prepared,
        fingerprint=fingerprint,
        cuts=cuts,
        ref=ref,
        record=record,
        seconds=seconds,
        base=base,
    )


def _store(ctx: Context, made: _MonolithicRun, out: Path | None) -> Made:
    """The run written as a reference file and sealed beside it, in ``out`` or the workspace's own
    references folder; run.json in the evidence folder then names the manifest."""
    run = made.run
    set_name = f"ref-{run.recipe.name}-{run.lane}-{run.run_id.lower()}"
    if out is None:
        folder = ctx.workspace.ensure(ctx.workspace.root / "references" / set_name)
    else:  # the operator's own folder (it is where the manifest's local origin points)
        folder = Path(out).resolve()
        folder.mkdir(parents=True, exist_ok=True)
    header = _header(made)
    tensors = _tensors("free", made.ref.trace, made.cuts)
    if made.ref.forced is not None:
        tensors += _tensors("forced", made.ref.forced, made.cuts)
    t1 = time.perf_counter()
    file, manifest = write_sealed(folder, set_name, header, tensors)
    size = file.stat().st_size
    _write_run_record(made, manifest)
    return Made(
        set_name=set_name,
        file=file,
        manifest=manifest,
        size=size,
        positions=sum(len(p["logit_positions"]) for p in header["free"]["prompts"]),
        seconds=made.seconds,
        seal_seconds=time.perf_counter() - t1,
        evidence=run.evidence,
    )


def _write_run_record(made: _MonolithicRun, manifest: Path) -> None:
    """run.json for a reference run: it signs nothing, so it names the sealed manifest instead."""
    run = made.run
    write_json(
        run.evidence / "run.json",
        {
            "run_id": run.run_id,
            "status": "REFERENCE",
            "recipe": run.recipe.name,
            "lane": run.lane,
            "reference": str(manifest),
            "seconds": round(made.seconds, 3),
        },
    )


def _header(made: _MonolithicRun) -> dict[str, Any]:
    """The reference file's JSON header: what was run, with what, on what, and the traces' shape;
    ``certify.sealed`` reads it back and holds a run's identity to it."""
    recipe, ref, cuts = made.run.recipe, made.ref, made.cuts
    first = ref.trace.prompts[0]
    return {
        "kind": reference_file.HEADER_KIND,
        "recipe": {"name": recipe.name, "digest": recipe.digest},
        "placement": recipe.monolithic.name,
        "lane": made.run.lane,
        "n_layer": recipe.n_layer,
        "n_vocab": int(first.logits.shape[1]),
        "width": int(next(iter(first.captures.values())).shape[1]) if cuts else 0,
        "cuts": cuts,
        "run_id": made.run.run_id,
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(made.seconds, 3),
        "identity": _identity_record(made.prepared.identity),
        "hardware": dict(made.fingerprint),
        "backend_devices": made.record.get("backend_devices"),
        "threads": made.record.get("threads"),
        "free": {"prompts": [_prompt(p) for p in ref.trace.prompts]},
        "forced": _forced_record(ref, made.base),
        "speed": ref.speed,
        "route_change": _route_record(recipe, ref.route),
    }


def _identity_record(ident: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the run's identity chain a reference is held to: source, patches, artifacts (each
    file's sha256) and the build's lane and key."""
    art = ident["artifacts"]
    return {
        "source": {k: ident["source"].get(k) for k in ("commit", "tree")},
        "patches": {"digest": ident["patches"]["digest"]},
        "artifacts": {k: art.get(k) for k in ("set", "variant", "manifest_digest")}
        | {"files": [{"name": f["name"], "sha256": f["sha256"]} for f in art.get("files", [])]},
        "build": {"lane": ident["build"]["lane"], "key": ident["build"]["key"]},
    }


def _forced_record(ref: Reference, base: sealed_ref.Sealed | None) -> dict[str, Any] | None:
    """The teacher-forced traces' prompts and the sha256 of the reference whose tokens forced them;
    None for a reference made on its own."""
    if ref.forced is None or base is None:
        return None
    return {"from_sha256": base.record["sha256"], "prompts": [_prompt(p) for p in ref.forced.prompts]}


def _route_record(recipe: Recipe, route: drive.RouteChange | None) -> dict[str, Any]:
    """The monolithic worker's own route change, stored so a same-lane certification can hold the
    staged switch to it without running the monolithic worker."""
    assert route is not None, "a lane's monolithic run always measures its route change"
    return {
        "placement": recipe.monolithic.name,
        "switch_at": route.switch_at,
        "reprefill_tokens": route.reprefill_tokens,
        "cache_miss": route.cache_miss,
        "reference": list(route.reference),
        "switched": list(route.switched),
    }


def _prompt(p: drive.PromptTrace) -> dict[str, Any]:
    return {"prompt": list(p.prompt), "tokens": list(p.tokens), "logit_positions": list(p.logit_positions)}


def _tensors(prefix: str, trace: drive.Trace, cuts: list[int]) -> list[reference_file.Tensor]:
    out = []
    for i, p in enumerate(trace.prompts):
        out.append(reference_file.Tensor(name=f"{prefix}.p{i}.logits", array=p.logits))
        out += [reference_file.Tensor(name=f"{prefix}.p{i}.capture.{c}", array=p.captures[c]) for c in cuts]
    return out


def _pinned_kv(header: Mapping[str, Any]) -> dict[str, str]:
    """Identity strings beside the header, pinned by the manifest (``gguf.kv``): provisioning holds the
    file to them whatever origin it came from."""
    ident = header["identity"]
    return {
        "recipe_digest": header["recipe"]["digest"],
        "patch_digest": ident["patches"]["digest"],
        "lane": header["lane"],
        "build_key": ident["build"]["key"],
    }


def write_sealed(
    folder: Path, set_name: str, header: Mapping[str, Any], tensors: list[reference_file.Tensor]
) -> tuple[Path, Path]:
    """Write the reference file ``<set>.gguf`` and seal it (``<set>.json`` beside it)."""
    file = folder / f"{set_name}.gguf"
    reference_file.write(file, header, _pinned_kv(header), tensors)
    return file, _seal(set_name, folder, file, header)


def _seal(set_name: str, folder: Path, file: Path, header: Mapping[str, Any]) -> Path:
    """The artifact-set manifest beside the file, its digests written by ``dgr seal``'s code."""
    from fetch.seal import seal

    arch = reference_file.ARCH
    manifest = folder / f"{set_name}.json"
    write_json(
        manifest,
        {
            "schema_version": 1,
            "name": set_name,
            "description": (
                f"sealed reference: recipe {header['recipe']['name']} "
                f"({header['recipe']['digest'][:16]}…), placement {header['placement']} on lane "
                f"{header['lane']}, run {header['run_id']} "
                f"({header['made']}); certify/reference_file.py describes the format"
            ),
            "model": f"dgr reference of {header['recipe']['name']}",
            "storage": "any",
            "origins": [{"kind": "local", "path": str(folder.resolve())}],
            "default_variant": "f32",
            "variants": {
                "f32": {
                    "chunk_size": CHUNK_SIZE,
                    "chunk_digest": "blake3",
                    "gguf": {
                        "architecture": arch,
                        "block_count": int(header["n_layer"]),
                        "kv": {f"{arch}.{k}": v for k, v in _pinned_kv(header).items()},
                    },
                    "files": [{"name": file.name}],
                }
            },
        },
    )
    return seal(set_name, folder, root=folder)


def compare(ctx: Context, recipe: Recipe, cpu: Path, other: Path, *, store: Path | None) -> Result:
    """A CPU reference and another lane's reference of the same recipe through the backend-agreement
    gate, without running either: the other one must have been teacher-forced on this CPU reference's
    tokens (``dgr reference --against``)."""
    from certify import measure

    a, b = _comparable_pair(ctx, recipe, cpu, other, store)
    assert b.forced is not None  # _comparable_pair refuses a reference that was not teacher-forced
    fp = b.header.get("hardware") or {}
    hc = recipe.hardware_class(b.lane, int(fp.get("cpu_cores", 1)), hardware.gpu_names(fp))
    limits = hc.agreement_for(b.lane)
    if limits is None:
        raise ConfigurationError(
            f"recipe {recipe.name}: class {hc.name} holds lane {b.lane} to no CPU reference"
        )
    cuts = [int(c) for c in a.header["cuts"]]
    figures = measure.agreement_figures(a.trace, b.forced, b.trace, margin=limits.top1_margin_min, cuts=cuts)
    flat = {k: v for k, v in figures.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    result = gates.evaluate_agreement(b.lane, limits, cuts, flat)
    details = {
        **result.details,
        "figures": figures,
        "cpu": a.record["sha256"],
        "other": b.record["sha256"],
        "hardware_class": hc.name,
    }
    return Result(name=result.name, status=result.status, reason=result.reason, details=details)


def _comparable_pair(
    ctx: Context, recipe: Recipe, cpu: Path, other: Path, store: Path | None
) -> tuple[sealed_ref.Sealed, sealed_ref.Sealed]:
    """Both references provisioned, verified and held to the recipe; exit 2 unless the first is the
    CPU's, the second was teacher-forced on it, and both were made from the same patches and artifacts
    (their figures would otherwise compare two different computations)."""
    a = sealed_ref.load(ctx, cpu, store=store)
    b = sealed_ref.load(ctx, other, store=store)
    for ref in (a, b):
        sealed_ref.check_recipe(ref, recipe)
    if a.lane != "cpu":
        raise ConfigurationError(f"{cpu}: a reference of lane {a.lane}; the first one must be the CPU's")
    if b.forced is None or b.header["forced"].get("from_sha256") != a.record["sha256"]:
        raise ConfigurationError(
            f"{other} was not teacher-forced on {cpu} (sha256 {a.record['sha256'][:16]}…)",
            hint=f"make it with `dgr reference --recipe {recipe.name} --lane {b.lane} --against {cpu}`",
        )
    for what, key, field in (
        ("patch digest", "patches", "digest"),
        ("artifacts", "artifacts", "manifest_digest"),
    ):
        theirs, ours = b.header["identity"][key][field], a.header["identity"][key][field]
        if theirs != ours:
            raise ConfigurationError(
                f"the two references were made with another {what}: {theirs[:16]}… vs {ours[:16]}…"
            )
    return a, b
