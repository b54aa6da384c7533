"""Run a recipe's scenarios on real workers and turn traces into gate figures and Results.

One launch per placement: the monolithic reference first (capturing the residual at every cut any
placement uses), then each staged placement: parity trace, speed samples and, on the recipe's
route-change placement, the epoch switch.  Workers are always stopped by the launcher; a worker that
dies, hangs or answers with the wrong shape raises StageFailed ("stage K (layers a:b) failed: ...").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from certify import drive, gates, metrics, physics
from certify.recipes import HardwareClass, Placement, Recipe
from certify.verdict import Result, Status
from worker.launcher import WorkerCommand, launch
from worker.stubs import Stubs

DTYPE_BYTES = {"f32": 4, "f16": 2}
TOKEN_ID_BYTES = 4  # one int32 token id per position: the hash-routing sideband


class Pipelines(Protocol):
    """Where a placement's stages run.  The default starts workers on loopback (worker.launcher);
    certify.seams starts them in network namespaces behind shaped links, certify.placement attaches to
    workers an operator already runs.  The context manager yields an object with ``clients`` (one
    StageClient per stage, in order) and stops (or, for attached workers, releases) them on exit."""

    def start(self, cmd: WorkerCommand, placement: Placement, tag: str) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True, kw_only=True)
class LocalPipelines:
    """Workers started by us on 127.0.0.1, stopped on exit (the launcher)."""

    stubs: Stubs
    evidence: Path
    env: Mapping[str, str]
    start_timeout: float = 120.0
    call_deadline: float = 120.0

    def start(self, cmd: WorkerCommand, placement: Placement, tag: str) -> AbstractContextManager[Any]:
        return launch(
            cmd,
            placement.stages,
            stubs=self.stubs,
            evidence=self.evidence / tag,
            env=self.env,
            start_timeout=self.start_timeout,
            call_deadline=self.call_deadline,
        )


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What to run: the recipe, the class whose thresholds apply, and how to start each lane's workers."""

    recipe: Recipe
    lane: str
    hardware_class: HardwareClass
    worker: WorkerCommand  # the lane under certification
    reference_worker: WorkerCommand | None = None  # the CPU build when the parity reference is CPU
    stubs: Stubs
    evidence: Path
    env: Mapping[str, str]
    start_timeout: float = 120.0
    call_deadline: float = 120.0
    pipelines: Pipelines | None = None  # None: LocalPipelines from the fields above

    def where(self) -> Pipelines:
        if self.pipelines is not None:
            return self.pipelines
        return LocalPipelines(stubs=self.stubs, evidence=self.evidence, env=self.env,
                              start_timeout=self.start_timeout, call_deadline=self.call_deadline)


@dataclass(kw_only=True)
class Outcome:
    results: list[Result] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def _speed_prompt(prompts: Sequence[Sequence[int]], n: int) -> list[int]:
    """``n`` prompt tokens for the speed runs: the recipe's prompts concatenated and repeated."""
    pool = [t for p in prompts for t in p]
    return [pool[i % len(pool)] for i in range(n)]


def _valid_rows(ref: drive.PromptTrace, cur: drive.PromptTrace) -> int:
    """Rows where both runs fed the same tokens: after the first greedy divergence the positions
    hold different inputs and comparing their logits would measure the divergence twice."""
    decode_rows = ref.logits.shape[0] - len(ref.prompt)
    return len(ref.prompt) + min(metrics.common_prefix(ref.tokens, cur.tokens), decode_rows)


def boundary_residual(boundary: np.ndarray, width: int) -> np.ndarray:
    """A seam's boundary as the reference's per-layer capture sees it.

    DeepSeek-V4 carries ``hc`` copies of the residual across a seam (``[n, hc * n_embd]``, the
    hyper-connection streams) while its capture is their mean (``[n, n_embd]``, the graph's
    dsv4_hc_mean).  Average the copies the way the graph does (float32, left to right, then times
    1/hc) so a bitwise-equal boundary compares with NMSE 0; the copies themselves are covered by
    the logit gates of every later stage.  A boundary as wide as the capture is returned as is.
    """
    hc, rest = divmod(boundary.shape[1], width)
    if rest or hc < 1:
        raise ValueError(f"boundary width {boundary.shape[1]} is not a multiple of the capture width {width}")
    if hc == 1:
        return boundary
    copies = boundary.reshape(boundary.shape[0], hc, width).astype(np.float32, copy=False)
    acc = copies[:, 0].copy()
    for s in range(1, hc):
        acc = acc + copies[:, s]
    return acc * np.float32(1.0 / hc)


def parity_figures(ref: drive.Trace, cur: drive.Trace) -> dict[str, Any]:
    ref_rows, cur_rows, greedy = [], [], []
    bounds: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {c: ([], []) for c in cur.cuts}
    for r, c in zip(ref.prompts, cur.prompts, strict=True):
        n = _valid_rows(r, c)
        ref_rows.append(r.logits[:n])
        cur_rows.append(c.logits[:n])
        greedy.append(metrics.greedy_match(r.tokens, c.tokens))
        for cut in cur.cuts:
            bounds[cut][0].append(r.captures[cut][:n])
            bounds[cut][1].append(boundary_residual(c.boundaries[cut][:n], r.captures[cut].shape[1]))
    a, b = np.concatenate(ref_rows), np.concatenate(cur_rows)
    kl = metrics.kl_divergence(a, b)
    out: dict[str, Any] = {
        "rows_compared": int(a.shape[0]),
        "top1_agreement": metrics.top1_agreement(a, b),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "logits_nmse": metrics.nmse(a, b),
        "max_abs_logit_diff": metrics.max_abs_diff(a, b),
        "greedy_match": min(greedy),
        "bitwise_logits": bool(np.array_equal(a, b)),
    }
    for cut, (rr, cc) in bounds.items():
        out[f"boundary_nmse@{cut}"] = metrics.nmse(np.concatenate(rr), np.concatenate(cc))
    return out


def speed_figures(samples: drive.SpeedSamples) -> dict[str, Any]:
    seams = [list(rep) for rep in samples.seam_seconds]
    compute = np.asarray(samples.stage_compute_per_token, dtype=np.float64)
    return {
        "decode_tok_s": metrics.median_iqr(samples.decode_tok_s).as_dict(),
        "prefill_tok_s": metrics.median_iqr(samples.prefill_tok_s).as_dict(),
        "seam_s": [float(np.median([rep[j] for rep in seams])) for j in range(len(seams[0]) if seams else 0)],
        "stage_compute_s": [float(np.median(compute[:, k])) for k in range(compute.shape[1])],
        "seam_bytes_per_token": [int(b) for b in samples.seam_bytes_per_token],
        "prompt_tokens": samples.n_prompt,
        "decode_tokens": samples.n_decode,
    }


def _placement_record(p: Placement, lane: str, dtype: str, role: str, infos: Sequence[Any]) -> dict[str, Any]:
    return {
        "name": p.name,
        "stages": [list(s) for s in p.stages],
        "n_stages": p.n_stages,
        "cuts": list(p.cuts),
        "boundary_dtype": dtype,
        "lane": lane,
        "role": role,
        "backend_devices": sorted({i.backend_devices for i in infos}),
        "threads": sorted({i.n_threads for i in infos}),
        "weight_bytes": [i.memory.weight_bytes for i in infos],
        "boundary_width": infos[0].boundary_width if infos else None,
        # stages that take the token ids next to the boundary (DeepSeek-V4 hash-routed layers)
        "token_sideband_stages": [k for k, i in enumerate(infos) if i.needs_token_sideband],
    }


def _gate_figures(
    parity: Mapping[str, Any] | None,
    speed: Mapping[str, Any] | None,
    seam_model: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    flat: dict[str, float] = {}
    if seam_model:
        for key, metric in (("seam_ratio_max", "seam_ratio_max"), ("seam_ratio_min", "seam_ratio_min"),
                            ("efficiency", "bound_efficiency")):
            if seam_model.get(key) is not None:
                flat[metric] = float(seam_model[key])
    if parity:
        flat.update(
            {k: v for k, v in parity.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        )
    if speed:
        flat["decode_tok_s"] = speed["decode_tok_s"]["median"]
        flat["prefill_tok_s"] = speed["prefill_tok_s"]["median"]
    return flat


def run(plan: Plan) -> Outcome:
    recipe, hc = plan.recipe, plan.hardware_class
    out = Outcome()
    cross = hc.parity.reference_lane == "cpu" and plan.lane != "cpu"
    ref_worker = plan.reference_worker if cross else plan.worker
    if cross and ref_worker is None:
        raise ValueError("a CPU reference build is needed for a cross-lane parity reference")
    assert ref_worker is not None
    cuts = sorted({c for p in recipe.placements.values() for c in p.cuts})
    mono = recipe.monolithic
    rc = recipe.route_change
    rc_placement = rc.placement if rc else recipe.staged[0].name
    rc_after = rc.after_tokens if rc else max(1, recipe.n_decode // 2)

    start = plan.where().start

    # The reference: monolithic, f32 seams (none), every cut captured.
    t0 = time.perf_counter()
    ref_tag = f"{mono.name}-reference-{'cpu' if cross else plan.lane}"
    with start(ref_worker, mono, ref_tag) as pipe:
        prompts = [pipe.clients[0].tokenize(text) for text in recipe.prompts.texts]
        reference = drive.run_placement(pipe.clients, prompts, recipe.n_decode, capture=cuts)
        ref_speed = None
        ref_route = None
        if not cross:
            ref_speed = speed_figures(_measure(pipe.clients, prompts, recipe, "f32"))
            # Re-prefilling a history in one batch is not bitwise the same computation as decoding it
            # token by token (accumulation order), so on real weights a near-tie can flip even on one
            # worker.  The staged route change is therefore held to the monolithic worker doing the
            # very same switch, which is bitwise comparable on one lane.
            ref_route = drive.route_change(pipe.clients, prompts[0], recipe.n_decode, rc_after)
        record = _placement_record(
            mono,
            "cpu" if cross else plan.lane,
            "f32",
            "reference" if not cross else "reference-cross-lane",
            reference.infos,
        )
    record["speed"] = ref_speed
    out.figures = {
        "reference": {"placement": mono.name, "lane": "cpu" if cross else plan.lane},
        "prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "n_decode": recipe.n_decode,
        "measure": {
            "warmup": recipe.measure.warmup,
            "repetitions": recipe.measure.repetitions,
            "prompt_tokens": recipe.measure.prompt_tokens,
            "decode_tokens": recipe.measure.decode_tokens,
        },
        "reference_tokens": [list(p.tokens) for p in reference.prompts],
        "placements": [record],
    }
    out.results.append(
        Result(
            name=f"reference/{mono.name}",
            status=Status.PASS,
            duration_s=time.perf_counter() - t0,
            reason="",
            details={"lane": record["lane"]},
        )
    )
    if not cross:
        out.results.append(
            gates.evaluate(
                "speed", mono.name, gates.speed_checks(hc.speed, mono), _gate_figures(None, ref_speed)
            )
        )

    under_test = ([mono] if cross else []) + list(recipe.staged)
    shaped, unshapeable = seam_pipelines(plan) if any(p.seams for p in under_test) else (None, "")
    for p in under_test:
        where = shaped if p.seams else plan.where()
        if where is None:
            # Never fake a scenario: say it was not run, and why (it does not count as a pass of any gate).
            out.results.append(Result(name=f"placement/{p.name}", status=Status.SKIPPED, reason=unshapeable))
            continue
        t0 = time.perf_counter()
        dtype = recipe.dtype_of(p)
        with where.start(plan.worker, p, p.name) as pipe:
            # How the stages reach each other and the driver's sink (namespaces, remote hosts); the
            # loopback launcher's stages are reached at their clients' own addresses.
            routing = dict(
                forwarding=p.forwarding,
                addresses=getattr(pipe, "addresses", None),
                sink_host=getattr(pipe, "sink_host", "127.0.0.1"),
            )
            trace = drive.run_placement(
                pipe.clients, prompts, recipe.n_decode, boundary_dtype=dtype, **routing
            )
            speed = speed_figures(_measure(pipe.clients, prompts, recipe, dtype, **routing))
            route = None
            if p.name == rc_placement:
                route = drive.route_change(
                    pipe.clients, prompts[0], recipe.n_decode, rc_after, boundary_dtype=dtype
                )
            record = _placement_record(p, plan.lane, dtype, "under test", trace.infos)
            shaping = describe_shaping(pipe)
            fabric = describe_fabric(pipe)
        parity = parity_figures(reference, trace)
        record.update(parity=parity, speed=speed, forwarding=p.forwarding)
        if fabric is not None:
            record["fabric"] = fabric
        if not p.is_monolithic:
            record["seam_model"] = physics.model(
                p, p.forwarding, speed, n_vocab=trace.infos[-1].n_vocab,
                sideband_stages=record["token_sideband_stages"], backend=shaping,
            )
        out.figures["placements"].append(record)
        elapsed = time.perf_counter() - t0
        out.results.append(
            gates.evaluate(
                "parity",
                p.name,
                gates.parity_checks(hc.parity_for(dtype), p),
                _gate_figures(parity, None),
                duration_s=elapsed,
            )
        )
        if p.is_monolithic:  # the lane's own monolithic run is the speed reference for its staged runs
            ref_speed = speed
        out.results.append(
            gates.evaluate(
                "speed",
                p.name,
                gates.speed_checks(hc.speed, p),
                _gate_figures(None, speed, record.get("seam_model")),
                _gate_figures(None, ref_speed),
            )
        )
        if route is not None:
            out.figures["route_change"], result = route_change_gate(p, route, ref_route)
            out.results.append(result)
    if "route_change" not in out.figures:
        out.results.append(
            Result(
                name=f"route-change/{rc_placement}",
                status=Status.FAIL,
                reason=f"the route-change check did not run (placement {rc_placement} was not run)",
            )
        )
    out.figures["physical_model"] = physical_model(recipe, out.figures["placements"])
    return out


def route_change_gate(
    p: Placement, route: drive.RouteChange, ref_route: drive.RouteChange | None
) -> tuple[dict[str, Any], Result]:
    """The route change's figures and gate.  Cross-lane runs have no same-lane monolithic switch to
    compare with: there the staged run's own uninterrupted decode is the expectation."""
    expected = ref_route.switched if ref_route is not None else route.reference
    figures = {
        "placement": p.name,
        "switch_at": route.switch_at,
        "reprefill_tokens": route.reprefill_tokens,
        "cache_miss": route.cache_miss,
        "reference": list(route.reference),
        "switched": list(route.switched),
        "expected": list(expected),
        "expected_from": "monolithic, same switch" if ref_route is not None else "uninterrupted",
        "switched_equals_uninterrupted": route.identical,
    }
    checks = [
        gates.AtLeast(name="tokens identical after re-prefill", metric="identical", limit=1),
        gates.AtLeast(name="new epoch refuses the old KV", metric="cache_miss", limit=1),
    ]
    measured = {
        "identical": float(tuple(route.switched) == tuple(expected)),
        "cache_miss": float(route.cache_miss != "ACCEPTED"),
    }
    return figures, gates.evaluate("route-change", p.name, checks, measured)


def seam_pipelines(plan: Plan) -> tuple[Pipelines | None, str]:
    """Where placements with shaped seams run: each stage in its own network namespace behind its
    link (certify.seams), or None and why they cannot run here.  Probed once per run: the probe makes
    and removes a namespace."""
    if plan.pipelines is not None:
        return None, ("shaped seams are simulated on one machine (network namespaces); these workers run "
                      "elsewhere and cross real links, so the placement is not run")
    from certify import seams

    support = seams.probe(plan.env)
    if not support.available:
        return None, f"shaped seams need network namespaces: {support.reason}; not run"
    return seams.NetnsPipelines(stubs=plan.stubs, evidence=plan.evidence, env=plan.env, support=support,
                                start_timeout=plan.start_timeout, call_deadline=plan.call_deadline), ""


def _measure(
    clients: Sequence[Any], prompts: Sequence[Sequence[int]], recipe: Recipe, dtype: str, **routing: Any
) -> drive.SpeedSamples:
    m = recipe.measure
    return drive.measure_speed(
        clients,
        _speed_prompt(prompts, m.prompt_tokens),
        m.decode_tokens,
        repetitions=m.repetitions,
        warmup=m.warmup,
        boundary_dtype=dtype,
        **routing,
    )


def describe_shaping(pipe: Any) -> str:
    """How the running pipeline's links are shaped, in words ("" on loopback)."""
    fabric = getattr(pipe, "fabric", None)
    if fabric is None:
        return ""
    return {"netem": "kernel netem", "shaper": "userspace shaper"}.get(fabric.backend, fabric.backend)


def describe_fabric(pipe: Any) -> dict[str, Any] | None:
    """The namespaces, addresses and link profiles the placement ran on (None on loopback)."""
    fabric = getattr(pipe, "fabric", None)
    return dict(fabric.describe()) if fabric is not None else None


def physical_model(recipe: Recipe, placements: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Boundary bytes per token per seam: measured on this model, and for the shape the recipe stands for."""
    rows = []
    seen: set[str] = set()
    for p in placements:
        sp = p.get("speed") or {}
        if sp.get("seam_bytes_per_token") and p["boundary_dtype"] not in seen:
            seen.add(p["boundary_dtype"])  # one measured row per seam dtype
            sideband = TOKEN_ID_BYTES if p.get("token_sideband_stages") else 0
            rows.append(
                {
                    "label": f"measured: {recipe.name} / {p['name']}",
                    "boundary_width": p.get("boundary_width"),
                    "dtype": p["boundary_dtype"],
                    "sideband_bytes_per_token": sideband,
                    "bytes_per_token": max(sp["seam_bytes_per_token"]) + sideband,
                    "source": "worker replies" + (" + token ids sent with the boundary" if sideband else ""),
                }
            )
    pm = recipe.physical_model
    if pm is not None:
        for dtype in sorted({recipe.boundary_dtype, *(recipe.dtype_of(p) for p in recipe.staged)}):
            rows.append(
                {
                    "label": pm.label,
                    "boundary_width": pm.boundary_width,
                    "dtype": dtype,
                    "sideband_bytes_per_token": pm.sideband_bytes_per_token,
                    "bytes_per_token": pm.boundary_width * DTYPE_BYTES[dtype] + pm.sideband_bytes_per_token,
                    "source": "recipe physical_model (width x dtype size + sideband)",
                }
            )
    return rows
