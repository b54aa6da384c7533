"""Run a recipe's scenarios on real workers and turn traces into gate figures and Results.

One launch per placement.  On a lane other than the CPU: the CPU monolithic reference first, free-running
with the residual captured at every cut any placement uses.  Then the lane's monolithic run (teacher-forced
on the CPU reference's tokens for the backend-agreement gate, then free-running: the staging-parity
reference, its speed and route change), with the residual at every cut captured by the worker on every
lane (on Vulkan since patch 0006: docs/upstream/vulkan-stale-descriptors.md); then each staged
placement: parity trace, speed samples and, on the recipe's route-change placement, the epoch switch.
Workers are always stopped by the launcher; a worker that dies, hangs or answers with the wrong shape
raises StageFailed ("stage K (layers a:b) failed: ...").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from certify import gates, metrics, mtp, throughput
from certify.sealed import Mode, Sealed
from certify.verdict import Result, Status
from manifests.recipe_model import BackendAgreement, HardwareClass, Mtp, Placement, Recipe
from pipeline import drive, physics, routes, transport_floor
from worker.client import StageClient
from worker.launcher import WorkerCommand, launch
from worker.stubs import Stubs
from worker.tls import Identity

DTYPE_BYTES = {"f32": 4, "f16": 2}
TOKEN_ID_BYTES = 4  # one int32 token id per position: the hash-routing sideband


class Fabric(Protocol):
    """The network a placement's stages run in (pipeline.seams.Fabric)."""

    @property
    def backend(self) -> str: ...

    def describe(self) -> Mapping[str, Any]: ...


class Started(Protocol):
    """What measuring reads from a started placement (worker.launcher.Pipeline on loopback,
    pipeline.seams.NetnsPipeline in namespaces, pipeline.attached.Attached for an operator's workers)."""

    @property
    def clients(self) -> Sequence[StageClient]:
        """One client per stage, in order."""
        ...

    @property
    def addresses(self) -> Sequence[str] | None:
        """How the stages reach each other (None: each client's own address)."""
        ...

    @property
    def sink_host(self) -> str:
        """Where the driver's sink listens: an address the last stage reaches."""
        ...

    @property
    def fabric(self) -> Fabric | None:
        """The shaped network the stages run in (None: loopback or real links)."""
        ...


class Pipelines(Protocol):
    """Where a placement's stages run.  The default starts workers on loopback (worker.launcher);
    pipeline.seams starts them in network namespaces behind shaped links, pipeline.attached attaches to
    workers an operator already runs.  The context manager yields the started placement and stops (or,
    for attached workers, releases) it on exit."""

    def start(
        self, cmd: WorkerCommand, placement: Placement, tag: str
    ) -> AbstractContextManager[Started]: ...


def reach(pipe: Started) -> routes.Reach:
    """How a route over ``pipe``'s stages reaches them and where its sink listens."""
    addresses = tuple(pipe.addresses) if pipe.addresses is not None else None
    return routes.Reach(addresses=addresses, sink_host=pipe.sink_host)


@dataclass(frozen=True, kw_only=True)
class LocalPipelines:
    """Workers started by us on 127.0.0.1, stopped on exit (the launcher)."""

    stubs: Stubs
    evidence: Path
    env: Mapping[str, str]
    start_timeout: float = 120.0
    call_deadline: float = 120.0

    def start(self, cmd: WorkerCommand, placement: Placement, tag: str) -> AbstractContextManager[Started]:
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
    reference_worker: WorkerCommand | None = None  # the CPU build, for the backend-agreement gate
    stubs: Stubs
    evidence: Path
    env: Mapping[str, str]
    start_timeout: float = 120.0
    call_deadline: float = 120.0
    pipelines: Pipelines | None = None  # None: LocalPipelines from the fields above
    # Certify against a sealed reference (certify.sealed) instead of a monolithic run: no monolithic
    # worker is started; this run's build key and fingerprint decide which gate holds the placements.
    sealed: Sealed | None = None
    build_key: str | None = None
    fingerprint: Mapping[str, Any] = field(default_factory=dict)

    def started_threads(self) -> int | None:
        """The thread count of the workers this run starts; None where it attaches to the operator's
        (their count is theirs, reported in each Info)."""
        return self.worker.threads if self.pipelines is None else None

    def where(self) -> Pipelines:
        if self.pipelines is not None:
            return self.pipelines
        return LocalPipelines(
            stubs=self.stubs,
            evidence=self.evidence,
            env=self.env,
            start_timeout=self.start_timeout,
            call_deadline=self.call_deadline,
        )


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


def staging_parity_figures(ref: drive.Trace, cur: drive.Trace) -> dict[str, Any]:
    """A placement against its lane's monolithic run, both free-running: rows up to the first greedy
    divergence, the greedy match, and the boundary at every cut against the monolithic capture."""
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
    out = logit_figures(a, b)
    out["greedy_match"] = min(greedy)
    for cut, (rr, cc) in bounds.items():
        out[f"boundary_nmse@{cut}"] = metrics.nmse(np.concatenate(rr), np.concatenate(cc))
    return out


def agreement_figures(
    ref: drive.Trace,
    forced: drive.Trace,
    free: drive.Trace,
    *,
    margin: float,
    cuts: Sequence[int] | None = None,
) -> dict[str, Any]:
    """A lane's monolithic run against the CPU reference.  ``forced`` was fed the reference's own
    tokens, so every row compares the same inputs (no cascade after one flip); ``free`` is the lane's
    free-running run, whose greedy match is reported, not gated.  Top-1 counts only the rows where
    the reference's top-1 logit leads its top-2 by more than ``margin``."""
    a = np.concatenate([p.logits for p in ref.prompts])
    b = np.concatenate([p.logits for p in forced.prompts])
    out = logit_figures(a, b)
    clear = metrics.top1_margin(a) > margin
    out["top1_margin_min"] = margin
    out["clear_rows"] = int(clear.sum())
    out["top1_agreement_clear"] = metrics.top1_agreement(a[clear], b[clear]) if clear.any() else float("nan")
    out["free_running_greedy_match"] = min(
        metrics.greedy_match(r.tokens, f.tokens) for r, f in zip(ref.prompts, free.prompts, strict=True)
    )
    for cut in sorted(ref.prompts[0].captures if cuts is None else cuts):
        rr = np.concatenate([p.captures[cut] for p in ref.prompts])
        cc = np.concatenate([p.captures[cut] for p in forced.prompts])
        out[f"boundary_nmse@{cut}"] = metrics.nmse(rr, cc)
    return out


def logit_figures(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Rows ``b`` against the reference rows ``a``: what every parity gate reads.  Finite rows equal
    bit for bit (every staged placement on the CPU) get the figures the metrics give them, without
    their float64 passes over every logit (gemma3: 262,144 per row)."""
    if a.shape[0] and np.array_equal(a, b) and np.isfinite(a).all():
        return {
            "rows_compared": int(a.shape[0]),
            "top1_agreement": 1.0,
            "kl_mean": 0.0,
            "kl_max": 0.0,
            "logits_nmse": 0.0,
            "max_abs_logit_diff": 0.0,
            "bitwise_logits": True,
        }
    return logit_figures_in_full(a, b)


def logit_figures_in_full(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """``logit_figures`` by the metrics over every row, whatever the rows."""
    kl = metrics.kl_divergence(a, b)
    return {
        "rows_compared": int(a.shape[0]),
        "top1_agreement": metrics.top1_agreement(a, b),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "logits_nmse": metrics.nmse(a, b),
        "max_abs_logit_diff": metrics.max_abs_diff(a, b),
        "bitwise_logits": bool(np.array_equal(a, b)),
    }


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
        **samples.observed,  # what the route saw of its traffic (a ring: how its deliveries came)
    }


def _placement_record(p: Placement, lane: str, dtype: str, role: str, trace: drive.Trace) -> dict[str, Any]:
    infos = trace.infos
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
        "cpus": [i.cpus for i in infos],  # each stage's --cpus as it reports it; "": free to run anywhere
        # each stage's gRPC port as it reports it (Info): mtls, plaintext-loopback, plaintext-insecure
        "transport": [i.transport for i in infos],
        # each stage's pass port frames as it reports them (Info): tls, mac (where its neighbour allows
        # them too), plaintext
        "pass_frames": [i.pass_frames for i in infos],
        "weight_bytes": [i.memory.weight_bytes for i in infos],
        # the KV cache each stage holds for one session context of n_ctx positions (the catalog's
        # KV bytes per token of context)
        "kv_bytes": [i.memory.kv_bytes for i in infos],
        "n_ctx": [i.n_ctx for i in infos],
        # what each stage held of each prompt's session once decoded, as [positions, state bytes] (the
        # Session RPC): the catalog's KV bytes per position, measured; [] from workers that predate it
        "kv_held": [
            [[f.n_past, f.state_bytes] for f in (pt.held[k] for pt in trace.prompts if pt.held)]
            for k in range(len(infos))
        ],
        # how each stage holds its weights (worker/README.md, "Weights in memory"): a speed figure's context
        "load_mode": [i.memory.load_mode for i in infos],
        "huge_page_bytes": [i.memory.huge_page_bytes for i in infos],
        "boundary_width": infos[0].boundary_width if infos else None,
        # stages that take the token ids next to the boundary (DeepSeek-V4 hash-routed layers)
        "token_sideband_stages": [k for k, i in enumerate(infos) if i.needs_token_sideband],
    }


def gate_figures(
    parity: Mapping[str, Any] | None,
    speed: Mapping[str, Any] | None,
    seam_model: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    flat: dict[str, float] = {}
    if seam_model:
        for key, metric in (
            ("seam_ratio_max", "seam_ratio_max"),
            ("seam_ratio_min", "seam_ratio_min"),
            ("efficiency", "bound_efficiency"),
        ):
            if seam_model.get(key) is not None:
                flat[metric] = float(seam_model[key])
    if parity:
        flat.update(
            {k: v for k, v in parity.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        )
    if speed:
        flat["decode_tok_s"] = speed["decode_tok_s"]["median"]
        flat["prefill_tok_s"] = speed["prefill_tok_s"]["median"]
        if "concurrency" in speed:
            flat["concurrency_diverging"] = float(speed["concurrency"]["diverging_sessions"])
    return flat


@dataclass(kw_only=True)
class Reference:
    """The lane's monolithic run: what every placement of the lane is compared with."""

    trace: drive.Trace
    prompts: list[list[int]]
    speed: dict[str, Any] | None  # None: a sealed reference made elsewhere (the ratio is NOT_APPLICABLE)
    route: drive.RouteChange | None  # None: no same-lane monolithic switch to hold the staged one to
    forced: drive.Trace | None = None  # teacher-forced on the CPU reference's tokens (backend agreement)
    forced_seconds: float = 0.0


def run(plan: Plan) -> Outcome:
    """Backend agreement first (non-CPU lanes: the CPU reference, then the lane's monolithic run
    teacher-forced on it), then the lane's monolithic run, then each staged placement against it."""
    recipe, hc = plan.recipe, plan.hardware_class
    out = Outcome()
    cuts = sorted({c for p in recipe.placements.values() for c in p.cuts})
    if plan.sealed is not None:
        raise ValueError("a plan with a sealed reference is run by certify.measure_sealed")
    limits = hc.agreement_for(plan.lane)
    cpu_ref = _cpu_reference(plan, cuts, out) if limits is not None else None
    ref = _lane_reference(plan, cuts, out, cpu_ref=cpu_ref)
    if cpu_ref is not None and limits is not None:
        _backend_agreement(plan, cuts, limits, cpu_ref, ref, out)
    else:
        out.figures["backend_agreement"] = {
            "applies": False,
            "reason": f"lane {plan.lane} is the reference every other lane is held to",
        }
    staged_placements(plan, ref, out)
    finish(recipe, out, tls=tls_pair(plan.worker))
    return out


def tls_pair(cmd: WorkerCommand) -> tuple[Identity, Identity] | None:
    """The run's workers' identity and the driver's, where it starts its workers over TLS (the transport
    floor's TLS rows measure the same crossings with them)."""
    from worker.tls import load

    return (load(cmd.tls), cmd.driver_tls) if cmd.tls is not None and cmd.driver_tls is not None else None


def finish(recipe: Recipe, out: Outcome, *, tls: tuple[Any, Any] | None = None) -> None:
    """What a run adds once every placement is in: the route change's result when it did not run,
    the physical model, and the transport floor each seam is read against (pipeline.transport_floor,
    measured here, on this machine, for each boundary size the run's seams carried)."""
    rc_placement, _ = route_change_at(recipe)
    if "route_change" not in out.figures:
        out.results.append(route_change_not_run(out.results, rc_placement))
    out.figures["physical_model"] = physical_model(recipe, out.figures["placements"])
    speeds = [p.get("speed") or {} for p in out.figures["placements"]]
    sizes = {b for sp in speeds for b in sp.get("seam_bytes_per_token", [])}
    if sizes:
        out.figures["transport_floor"] = transport_floor.measure(sizes, tls=tls)


def route_change_at(recipe: Recipe) -> tuple[str, int]:
    """Where the route change runs and after how many tokens (the recipe's, else the first staged
    placement halfway through the decode)."""
    rc = recipe.route_change
    if rc is not None:
        return rc.placement, rc.after_tokens
    return recipe.staged[0].name, max(1, recipe.n_decode // 2)


def route_change_not_run(results: Sequence[Result], rc_placement: str) -> Result:
    """The route change's result when it did not run: SKIPPED with its placement's reason where that
    placement was SKIPPED (shaped seams this machine cannot make), otherwise FAIL (it should have run)."""
    name = f"route-change/{rc_placement}"
    skip = next(
        (r for r in results if r.name == f"placement/{rc_placement}" and r.status is Status.SKIPPED), None
    )
    if skip is not None:
        return Result(
            name=name, status=Status.SKIPPED, reason=f"placement {rc_placement} was SKIPPED ({skip.reason})"
        )
    return Result(
        name=name,
        status=Status.FAIL,
        reason=f"the route-change check did not run (placement {rc_placement} was not run)",
    )


@dataclass(kw_only=True)
class _CpuReference:
    trace: drive.Trace
    prompts: list[list[int]]
    seconds: float


def _cpu_reference(plan: Plan, cuts: Sequence[int], out: Outcome) -> _CpuReference:
    """The CPU monolithic reference of backend agreement: free-running greedy, every cut captured."""
    if plan.reference_worker is None:
        raise ValueError("a CPU reference build is needed for the backend-agreement gate")
    recipe, mono = plan.recipe, plan.recipe.monolithic
    t0 = time.perf_counter()
    with plan.where().start(plan.reference_worker, mono, f"{mono.name}-reference-cpu") as pipe:
        prompts = [pipe.clients[0].tokenize(text) for text in recipe.prompts.texts]
        trace = drive.run_placement(pipe.clients, prompts, recipe.n_decode, capture=cuts)
        record = _placement_record(mono, "cpu", "f32", "backend-reference", trace)
    out.figures.setdefault("placements", []).append(record)
    return _CpuReference(trace=trace, prompts=prompts, seconds=time.perf_counter() - t0)


def lane_monolithic(
    plan: Plan,
    cuts: Sequence[int],
    *,
    prompts: Sequence[Sequence[int]] | None = None,
    continuations: Sequence[Sequence[int]] | None = None,
) -> tuple[Reference, dict[str, Any]]:
    """The lane's monolithic worker: free-running with every cut captured (the staging-parity
    reference), its speed (the staged/monolithic reference) and its own route change (bitwise
    comparable); with ``continuations`` (another reference's tokens) also teacher-forced on them.
    ``prompts``: token ids to use (else the recipe's texts, tokenized by the worker).  Returns the
    reference and its placement record; ``dgr reference`` stores what this returns."""
    recipe, mono = plan.recipe, plan.recipe.monolithic
    _, rc_after = route_change_at(recipe)
    with plan.where().start(plan.worker, mono, f"{mono.name}-reference-{plan.lane}") as pipe:
        prompts = _prompt_tokens(pipe.clients[0], recipe, prompts)
        forced, forced_seconds = _teacher_forced(pipe.clients, prompts, recipe.n_decode, cuts, continuations)
        trace = drive.run_placement(pipe.clients, prompts, recipe.n_decode, capture=cuts)
        speed = _speed(pipe.clients, prompts, recipe, "f32", mono.n_stages)
        # Re-prefilling a history in one batch is not bitwise the same computation as decoding it
        # token by token (accumulation order), so on real weights a near-tie can flip even on one
        # worker.  The staged route change is therefore held to the monolithic worker doing the
        # very same switch, which is bitwise comparable on one lane.
        route = drive.route_change(pipe.clients, prompts[0], recipe.n_decode, rc_after)
        record = _placement_record(mono, plan.lane, "f32", "reference", trace)
        if isinstance(recipe.mtp, Mtp):
            record["mtp"] = mtp.mtp_figures(
                pipe.clients,
                prompts,
                trace,
                recipe.mtp.draft_tokens,
                recipe.n_decode,
                boundary_dtype="f32",
                route=routes.spec_named(mono.forwarding),
            )
    record["speed"] = speed
    ref = Reference(
        trace=trace, prompts=prompts, speed=speed, route=route, forced=forced, forced_seconds=forced_seconds
    )
    return ref, record


def _prompt_tokens(
    first: StageClient, recipe: Recipe, prompts: Sequence[Sequence[int]] | None
) -> list[list[int]]:
    """The given prompts' token ids, else the recipe's texts as the worker tokenizes them."""
    if prompts is not None:
        return [list(p) for p in prompts]
    return [first.tokenize(t) for t in recipe.prompts.texts]


def _teacher_forced(
    clients: Sequence[StageClient],
    prompts: Sequence[Sequence[int]],
    n_decode: int,
    capture: Sequence[int],
    continuations: Sequence[Sequence[int]] | None,
) -> tuple[drive.Trace | None, float]:
    """The run fed ``continuations`` (None without them) and how long it took."""
    if continuations is None:
        return None, 0.0
    started = time.perf_counter()
    forced = drive.run_placement(clients, prompts, n_decode, capture=capture, forced=continuations)
    return forced, time.perf_counter() - started


def _lane_reference(
    plan: Plan, cuts: Sequence[int], out: Outcome, *, cpu_ref: _CpuReference | None
) -> Reference:
    """The lane's monolithic run (lane_monolithic), with a CPU reference also teacher-forced on the
    reference's tokens (the backend-agreement figures); its figures, result and speed gate."""
    hc, mono = plan.hardware_class, plan.recipe.monolithic
    t0 = time.perf_counter()
    continuations = [list(p.tokens) for p in cpu_ref.trace.prompts] if cpu_ref else None
    ref, record = lane_monolithic(
        plan, cuts, prompts=cpu_ref.prompts if cpu_ref else None, continuations=continuations
    )
    reference_figures(plan, ref, out)
    out.figures.setdefault("placements", []).append(record)
    out.results.append(
        Result(
            name=f"reference/{mono.name}",
            status=Status.PASS,
            duration_s=time.perf_counter() - t0,
            details={"lane": plan.lane},
        )
    )
    if "mtp" in record:
        out.results.append(mtp.mtp_result(mono.name, record["mtp"]))
    out.results.append(
        gates.evaluate(
            "speed",
            mono.name,
            gates.speed_checks(hc.speed, mono, concurrency=bool(plan.recipe.measure.concurrency)),
            gate_figures(None, ref.speed),
        )
    )
    return ref


def reference_figures(plan: Plan, ref: Reference, out: Outcome, **where: Any) -> None:
    recipe = plan.recipe
    out.figures.update(
        {
            "reference": {"placement": recipe.monolithic.name, "lane": plan.lane, **where},
            "prompts": len(ref.prompts),
            "prompt_tokens": [len(p) for p in ref.prompts],
            "n_decode": recipe.n_decode,
            "measure": dataclasses.asdict(recipe.measure),
            "reference_tokens": [list(p.tokens) for p in ref.trace.prompts],
        }
    )


def _with_captures(trace: drive.Trace, seams: drive.Trace, width: int) -> drive.Trace:
    """``trace`` with each prompt's captures taken from ``seams``' boundaries (as residuals)."""
    prompts = tuple(
        dataclasses.replace(p, captures={c: boundary_residual(b, width) for c, b in s.boundaries.items()})
        for p, s in zip(trace.prompts, seams.prompts, strict=True)
    )
    return dataclasses.replace(trace, prompts=prompts)


def _backend_agreement(
    plan: Plan,
    cuts: Sequence[int],
    limits: BackendAgreement,
    cpu_ref: _CpuReference,
    ref: Reference,
    out: Outcome,
) -> None:
    """The lane's teacher-forced monolithic run scored against the CPU reference."""
    assert ref.forced is not None
    figures = agreement_figures(cpu_ref.trace, ref.forced, ref.trace, margin=limits.top1_margin_min)
    result = gates.evaluate_agreement(
        plan.lane, limits, cuts, gate_figures(figures, None), duration_s=cpu_ref.seconds + ref.forced_seconds
    )
    out.figures["backend_agreement"] = {
        "applies": True,
        "lane": plan.lane,
        "reference_lane": "cpu",
        "placement": plan.recipe.monolithic.name,
        "teacher_forced": True,
        "cuts": list(cuts),
        "divergence_starts_at": result.details["divergence_starts_at"],
        **figures,
    }
    out.results.append(result)


def staged_placements(
    plan: Plan,
    ref: Reference,
    out: Outcome,
    *,
    mode: Mode | None = None,
    agreement: BackendAgreement | None = None,
) -> None:
    """Each staged placement on the lane against the lane's monolithic run (shaped ones in their
    network fabric, or SKIPPED with the reason they cannot run here).  ``agreement``: a sealed
    reference of another lane or build, each placement held to it by the backend-agreement gate."""
    staged = plan.recipe.staged
    shaped, unshapeable = seam_pipelines(plan) if any(p.seams for p in staged) else (None, "")
    for p in staged:
        where = shaped if p.seams else plan.where()
        if where is None:
            # Never fake a scenario: say it was not run, and why (it does not count as a pass of any gate).
            out.results.append(Result(name=f"placement/{p.name}", status=Status.SKIPPED, reason=unshapeable))
            continue
        _staged_placement(plan, p, where, ref, out, mode=mode, agreement=agreement)


@dataclass(kw_only=True)
class _StagedRun:
    """What one staged placement's workers gave, before any gate reads it."""

    route: routes.RouteSpec
    dtype: str  # the boundary's
    trace: drive.Trace
    forced: drive.Trace | None  # teacher-forced on the reference's tokens (backend agreement)
    speed: dict[str, Any]
    route_change: drive.RouteChange | None  # on the recipe's route-change placement
    record: dict[str, Any]
    shaping: str
    fabric: dict[str, Any] | None


def _staged_placement(
    plan: Plan,
    p: Placement,
    where: Pipelines,
    ref: Reference,
    out: Outcome,
    *,
    mode: Mode | None = None,
    agreement: BackendAgreement | None = None,
) -> None:
    """Run one staged placement, then its gates: staging parity (or backend agreement against a sealed
    reference of another lane or build), speed, MTP and the route change where they apply."""
    t0 = time.perf_counter()
    run = _run_staged(plan, p, where, ref, forcing=agreement is not None)
    record = _staged_record(p, run)
    if agreement is not None and run.forced is not None:
        out.results.append(_agreement_gate(plan, p, ref, run, agreement, record, t0))
    else:
        out.results.append(_parity_gate(plan, p, ref, run, record, t0))
    out.figures["placements"].append(record)
    out.results.append(_staged_speed_gate(plan, p, ref, run, mode))
    if "mtp" in record:
        out.results.append(mtp.mtp_result(p.name, record["mtp"]))
    if run.route_change is not None:
        sealed = mode is not None and ref.route is not None
        out.figures["route_change"], result = route_change_gate(p, run.route_change, ref.route, sealed=sealed)
        out.results.append(result)


def _run_staged(plan: Plan, p: Placement, where: Pipelines, ref: Reference, *, forcing: bool) -> _StagedRun:
    """The placement's workers started once for everything measured on them: the parity trace, the
    teacher-forced trace (``forcing``), speed, the route change and MTP where the recipe asks."""
    recipe = plan.recipe
    rc_placement, rc_after = route_change_at(recipe)
    dtype, spec = recipe.dtype_of(p), routes.spec_named(p.forwarding)
    with where.start(plan.worker, p, p.name) as pipe:
        clients, to = pipe.clients, reach(pipe)
        trace = drive.run_placement(
            clients, ref.prompts, recipe.n_decode, boundary_dtype=dtype, route=spec, reach=to
        )
        # the reference's tokens fed through the same stages, on a route the driver feeds
        forced = _forced_on(clients, ref, recipe.n_decode, dtype, spec.driver_fed(), to) if forcing else None
        speed = _speed(clients, ref.prompts, recipe, dtype, p.n_stages, route=spec, reach=to)
        changed = None
        if p.name == rc_placement:
            changed = drive.route_change(
                clients, ref.prompts[0], recipe.n_decode, rc_after, boundary_dtype=dtype
            )
        record = _placement_record(p, plan.lane, dtype, "under test", trace)
        if isinstance(recipe.mtp, Mtp):
            record["mtp"] = mtp.mtp_figures(
                clients,
                ref.prompts,
                trace,
                recipe.mtp.draft_tokens,
                recipe.n_decode,
                boundary_dtype=dtype,
                route=spec,
                reach=to,
            )
        return _StagedRun(
            route=spec,
            dtype=dtype,
            trace=trace,
            forced=forced,
            speed=speed,
            route_change=changed,
            record=record,
            shaping=describe_shaping(pipe),
            fabric=describe_fabric(pipe),
        )


def _forced_on(
    clients: Sequence[StageClient],
    ref: Reference,
    n_decode: int,
    dtype: str,
    route: routes.RouteSpec,
    to: routes.Reach,
) -> drive.Trace:
    """The placement teacher-forced on the reference's tokens (the backend-agreement figures)."""
    continuations = [list(t.tokens) for t in ref.trace.prompts]
    return drive.run_placement(
        clients, ref.prompts, n_decode, boundary_dtype=dtype, forced=continuations, route=route, reach=to
    )


def _staged_record(p: Placement, run: _StagedRun) -> dict[str, Any]:
    """The placement's record: what it ran on, its speed, its route's own record, its seam model."""
    record = run.record
    record.update(speed=run.speed, **run.trace.route)
    if run.fabric is not None:
        record["fabric"] = run.fabric
    record["seam_model"] = physics.model(
        p,
        run.route,
        run.speed,
        n_vocab=run.trace.infos[-1].n_vocab,
        sideband_stages=record["token_sideband_stages"],
        backend=run.shaping,
    )
    return record


def _agreement_gate(
    plan: Plan,
    p: Placement,
    ref: Reference,
    run: _StagedRun,
    agreement: BackendAgreement,
    record: dict[str, Any],
    t0: float,
) -> Result:
    """The placement held to a sealed reference of another lane or build (its figures into ``record``)."""
    assert run.forced is not None
    width = run.trace.infos[0].n_embd
    figures = agreement_figures(
        ref.trace,
        _with_captures(run.forced, run.forced, width),
        run.trace,
        margin=agreement.top1_margin_min,
        cuts=p.cuts,
    )
    record["agreement"] = figures
    return gates.evaluate_agreement(
        plan.lane,
        agreement,
        p.cuts,
        gate_figures(figures, None),
        duration_s=time.perf_counter() - t0,
        placement=p.name,
    )


def _parity_gate(
    plan: Plan, p: Placement, ref: Reference, run: _StagedRun, record: dict[str, Any], t0: float
) -> Result:
    """The placement held to the lane's monolithic run (its figures into ``record``)."""
    parity = staging_parity_figures(ref.trace, run.trace)
    record["parity"] = parity
    checks = gates.staging_parity_checks(plan.hardware_class.staging_parity_for(run.dtype), p)
    return gates.evaluate(
        gates.STAGING_PARITY, p.name, checks, gate_figures(parity, None), duration_s=time.perf_counter() - t0
    )


def _staged_speed_gate(
    plan: Plan, p: Placement, ref: Reference, run: _StagedRun, mode: Mode | None
) -> Result:
    not_applicable = mode.speed_reason if mode is not None and not mode.speed_carried else ""
    checks = gates.speed_checks(
        plan.hardware_class.speed,
        p,
        ratio_not_applicable=not_applicable,
        concurrency=bool(plan.recipe.measure.concurrency),
    )
    return gates.evaluate(
        "speed",
        p.name,
        checks,
        gate_figures(None, run.speed, run.record.get("seam_model")),
        gate_figures(None, ref.speed) if ref.speed is not None else None,
    )


def route_change_gate(
    p: Placement,
    route: drive.RouteChange,
    ref_route: drive.RouteChange | None,
    *,
    sealed: bool = False,
    gate: str = "route-change",
) -> tuple[dict[str, Any], Result]:
    """The route change's figures and gate.  Cross-lane runs have no same-lane monolithic switch to
    compare with: there the staged run's own uninterrupted decode is the expectation."""
    expected = ref_route.switched if ref_route is not None else route.reference
    figures = {
        "placement": p.name,
        "switch_at": route.switch_at,
        "reprefill_tokens": route.reprefill_tokens,
        "reprefill_s": route.reprefill_seconds,
        "cache_miss": route.cache_miss,
        "reference": list(route.reference),
        "switched": list(route.switched),
        "expected": list(expected),
        "expected_from": (
            "uninterrupted"
            if ref_route is None
            else "sealed reference's monolithic, same switch"
            if sealed
            else "monolithic, same switch"
        ),
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
    return figures, gates.evaluate(gate, p.name, checks, measured)


def seam_pipelines(plan: Plan) -> tuple[Pipelines | None, str]:
    """Where placements with shaped seams run: each stage in its own network namespace behind its
    link (pipeline.seams), or None and why they cannot run here.  Probed once per run: the probe makes
    and removes a namespace."""
    if plan.pipelines is not None:
        return None, (
            "shaped seams are simulated on one machine (network namespaces); these workers run "
            "elsewhere and cross real links, so the placement is not run"
        )
    from pipeline import seams

    support = seams.probe(plan.env)
    if not support.available:
        return None, f"shaped seams need network namespaces: {support.reason}; not run"
    return seams.NetnsPipelines(
        stubs=plan.stubs,
        evidence=plan.evidence,
        env=plan.env,
        support=support,
        start_timeout=plan.start_timeout,
        call_deadline=plan.call_deadline,
    ), ""


def _speed(
    clients: Sequence[StageClient],
    prompts: Sequence[Sequence[int]],
    recipe: Recipe,
    dtype: str,
    n_stages: int,
    *,
    route: routes.RouteSpec = routes.RELAYED,
    reach: routes.Reach = routes.LOOPBACK,
) -> dict[str, Any]:
    """Single-stream speed figures, and the throughput of several sessions at once where the recipe
    asks for it (certify.throughput)."""
    m = recipe.measure
    samples = drive.measure_speed(
        clients,
        _speed_prompt(prompts, m.prompt_tokens),
        m.decode_tokens,
        repetitions=m.repetitions,
        warmup=m.warmup,
        boundary_dtype=dtype,
        route=route,
        reach=reach,
    )
    speed = speed_figures(samples)
    if m.concurrency:
        speed["concurrency"] = throughput.concurrency_figures(
            clients,
            _speed_prompt(prompts, m.prompt_tokens),
            m.decode_tokens,
            m.concurrency_levels(n_stages),
            rounds=m.concurrency_rounds,
            boundary_dtype=dtype,
            route=route,
            reach=reach,
        )
    return speed


def describe_shaping(pipe: Started) -> str:
    """How the running pipeline's links are shaped, in words ("" on loopback)."""
    if pipe.fabric is None:
        return ""
    return {"netem": "kernel netem", "shaper": "userspace shaper"}.get(
        pipe.fabric.backend, pipe.fabric.backend
    )


def describe_fabric(pipe: Started) -> dict[str, Any] | None:
    """The namespaces, addresses and link profiles the placement ran on (None on loopback)."""
    return dict(pipe.fabric.describe()) if pipe.fabric is not None else None


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
