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
from typing import Any

from certify import gates, hardware, reference_file
from certify import sealed as sealed_ref
from certify.inputs import Prepared, ctx_size, prepare, worker_threads
from certify.run import Run, make_plan, new_run_id, write_run_identity
from certify.verdict import Result
from core.canonical import write_json
from core.context import Context
from core.errors import ConfigurationError
from manifests.recipe_model import Recipe
from pipeline import drive

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
    fp = dict(fingerprint) if fingerprint is not None else hardware.fingerprint(ctx.env)
    hc = recipe.hardware_class(lane, int(fp["cpu_cores"]), hardware.gpu_names(fp))
    cuts = sorted({c for p in recipe.placements.values() for c in p.cuts})
    if base is not None:
        sealed_ref.check(base, recipe, prepared.identity, cuts)
    run_id = new_run_id()
    run = Run(
        recipe=recipe,
        lane=lane,
        run_id=run_id,
        started=time.time(),
        evidence=ctx.workspace.ensure(ctx.workspace.runs / run_id),
    )
    write_run_identity(run, prepared)
    plan = make_plan(
        ctx,
        run,
        hc,
        prepared,
        context=ctx_size(recipe),
        threads=worker_threads(ctx.env, int(fp["cpu_cores"]), recipe.most_stages),
        start_timeout=start_timeout,
        call_deadline=PLAN_TIMEOUT_S,
    )
    from certify import measure

    t0 = time.perf_counter()
    ref, record = measure.lane_monolithic(
        plan,
        cuts,
        prompts=base.prompts if base else None,
        continuations=[list(p.tokens) for p in base.trace.prompts] if base else None,
    )
    seconds = time.perf_counter() - t0
    set_name = f"ref-{recipe.name}-{lane}-{run_id.lower()}"
    if out is None:
        folder = ctx.workspace.ensure(ctx.workspace.root / "references" / set_name)
    else:  # the operator's own folder (it is where the manifest's local origin points)
        folder = Path(out).resolve()
        folder.mkdir(parents=True, exist_ok=True)
    header = _header(recipe, lane, prepared, fp, run_id, cuts, ref, record, seconds, base)
    tensors = _tensors("free", ref.trace, cuts)
    if ref.forced is not None:
        tensors += _tensors("forced", ref.forced, cuts)
    t1 = time.perf_counter()
    file, manifest = write_sealed(folder, set_name, header, tensors)
    size = file.stat().st_size
    write_json(
        run.evidence / "run.json",
        {
            "run_id": run_id,
            "status": "REFERENCE",
            "recipe": recipe.name,
            "lane": lane,
            "reference": str(manifest),
            "seconds": round(seconds, 3),
        },
    )
    return Made(
        set_name=set_name,
        file=file,
        manifest=manifest,
        size=size,
        positions=sum(len(p["logit_positions"]) for p in header["free"]["prompts"]),
        seconds=seconds,
        seal_seconds=time.perf_counter() - t1,
        evidence=run.evidence,
    )


def _header(
    recipe: Recipe,
    lane: str,
    prepared: Prepared,
    fp: Mapping[str, Any],
    run_id: str,
    cuts: list[int],
    ref: Any,
    record: Mapping[str, Any],
    seconds: float,
    base: sealed_ref.Sealed | None,
) -> dict[str, Any]:
    ident = prepared.identity
    art = ident["artifacts"]
    first = ref.trace.prompts[0]
    return {
        "kind": reference_file.HEADER_KIND,
        "recipe": {"name": recipe.name, "digest": recipe.digest},
        "placement": recipe.monolithic.name,
        "lane": lane,
        "n_layer": recipe.n_layer,
        "n_vocab": int(first.logits.shape[1]),
        "width": int(next(iter(first.captures.values())).shape[1]) if cuts else 0,
        "cuts": cuts,
        "run_id": run_id,
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 3),
        "identity": {
            "source": {k: ident["source"].get(k) for k in ("commit", "tree")},
            "patches": {"digest": ident["patches"]["digest"]},
            "artifacts": {k: art.get(k) for k in ("set", "variant", "manifest_digest")}
            | {"files": [{"name": f["name"], "sha256": f["sha256"]} for f in art.get("files", [])]},
            "build": {"lane": ident["build"]["lane"], "key": ident["build"]["key"]},
        },
        "hardware": dict(fp),
        "backend_devices": record.get("backend_devices"),
        "threads": record.get("threads"),
        "free": {"prompts": [_prompt(p) for p in ref.trace.prompts]},
        "forced": (
            {"from_sha256": base.record["sha256"], "prompts": [_prompt(p) for p in ref.forced.prompts]}
            if ref.forced is not None and base is not None
            else None
        ),
        "speed": ref.speed,
        "route_change": {
            "placement": recipe.monolithic.name,
            "switch_at": ref.route.switch_at,
            "reprefill_tokens": ref.route.reprefill_tokens,
            "cache_miss": ref.route.cache_miss,
            "reference": list(ref.route.reference),
            "switched": list(ref.route.switched),
        },
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
    for what, theirs, ours in (
        (
            "patch digest",
            b.header["identity"]["patches"]["digest"],
            a.header["identity"]["patches"]["digest"],
        ),
        (
            "artifacts",
            b.header["identity"]["artifacts"]["manifest_digest"],
            a.header["identity"]["artifacts"]["manifest_digest"],
        ),
    ):
        if theirs != ours:
            raise ConfigurationError(
                f"the two references were made with another {what}: {theirs[:16]}… vs {ours[:16]}…"
            )
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
