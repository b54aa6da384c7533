"""Certified at depth (docs/gates.md, "Depth"): the recipe's context scenario, run on the monolithic
worker and on each placement it names, the placements held to it by three gates.

* ``depth-parity``: the judged rows (the last position of every prefill pass, spread over the whole
  context, and every decoded position up to the first greedy divergence) against the monolithic run at
  the same depth, with the hardware class's staging-parity limits (bitwise on the CPU lane), and the
  greedy continuation after every prompt.
* ``kv-at-depth``: the KV bytes the stages allocate for the scenario's context, as each worker reports
  them (llama.cpp's memory breakdown, not a formula), sum to what the monolithic worker allocates, and
  each stage's memory, layer by layer as its worker reads it from its own graph, is the monolithic
  worker's for those layers (certify/kv_stages.py): a stage that holds another stage's layers, or drops
  some of its own, is caught and named here.
* ``state-at-depth`` (architectures with compressed caches, certify/state.py): every stage's workers
  count the compressed and sliding-window state their passes filled (``--census``); each placement's
  counts, layer by layer, equal the monolithic worker's, which meet the recipe's ``exercised``
  conditioning.
* ``route-change-at-depth``: on one placement (the recipe's route-change placement where the scenario
  runs it, else its first), the route epoch changes halfway through the decode after the longest
  prompt; the stages must refuse the old KV and, after re-prefilling the whole history, choose the
  tokens the monolithic worker chooses after the very same switch.  Not the uninterrupted session's:
  a re-prefill computes the decoded positions in one batch where the session decoded them one by one,
  which is not the same arithmetic (on tiny-v4 at 4,352 tokens the last re-prefilled row moved by 0.24
  and flipped a token whose margin was 0.003, on one worker: docs/measurements/issue-41), so whether the
  switch equals the uninterrupted session is reported, not gated.  The re-prefill's seconds are what a
  route change costs at that depth (``figures.depth.route_change.reprefill_s``, shown in the report).

Every worker of the scenario is started with the scenario's context and ubatch (``--ctx``, ``--batch``),
apart from the short-context run's workers, so the depth figures never mix with the ones made at the
recipe's short prompts.  Workers attached from a placement file, or a sealed reference, hold contexts
the run did not choose: the scenario is SKIPPED there, with that reason (never counted as a pass).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from certify import depth_prompt, gates, kv_stages, metrics, state
from certify.measure import Outcome, Plan, logit_figures, reach, route_change_gate
from certify.verdict import Result, Status
from manifests.recipe_model import Depth, Placement, RouteChange
from pipeline import drive, routes
from pipeline.depth import DepthTrace, run_at_depth
from worker.client import StageInfo
from worker.launcher import WorkerCommand

DEPTH_PARITY = "depth-parity"
PIPELINED = "pipelined"
KV_AT_DEPTH = "kv-at-depth"
ROUTE_CHANGE_AT_DEPTH = "route-change-at-depth"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _AtDepth:
    """One placement's workers at the scenario's context: their Info and one trace per prompt length."""

    infos: tuple[StageInfo, ...]
    traces: Mapping[int, DepthTrace]
    seconds: float
    # staged placements: the longest prompt's prefill on the other prefill route (pipelined where the
    # placement's own is not, else relayed), for the pipelined prefill's figures
    other: DepthTrace | None = None
    other_route: str = ""
    route_change: drive.RouteChange | None = None  # on the placement the scenario switches routes on

    @property
    def census(self) -> bool:
        """Its workers counted the state they filled (--census)."""
        return any(i.census for i in self.infos)


def run(plan: Plan, out: Outcome) -> None:
    """The scenario on the monolithic worker, then on every placement it names (figures under
    ``out.figures["depth"]``, one result per gate and placement)."""
    depth = plan.recipe.depth
    if depth is None:
        out.figures["depth"] = {
            "applies": False,
            "reason": f"recipe {plan.recipe.name} names no depth scenario",
        }
        return
    if plan.pipelines is not None or plan.sealed is not None:
        why = "the workers are attached from a placement file" if plan.pipelines else "a sealed reference"
        reason = f"{why}: their context is not the scenario's to choose"
        out.figures["depth"] = {"applies": False, "reason": reason, "scenario": scenario_record(depth)}
        out.results.append(Result(name="depth", status=Status.SKIPPED, reason=reason))
        return
    census = plan.recipe.architecture in state.CENSUS_ARCHITECTURES
    cmd = dataclasses.replace(plan.worker, ctx_size=depth.context, batch=depth.ubatch, census=census)
    mono, prompts = _monolithic(plan, cmd, depth)
    figures: dict[str, Any] = {
        "applies": True,
        "scenario": scenario_record(depth),
        "monolithic": _record(mono),
    }
    figures["placements"] = []
    for p in plan.recipe.at_depth:
        staged = _staged(plan, cmd, p, prompts, depth)
        record, results = judge(plan, p, mono, staged)
        figures["placements"].append(record)
        out.results += results
        if staged.route_change is not None:
            changed, result = route_change_gate(
                p, staged.route_change, mono.route_change, gate=ROUTE_CHANGE_AT_DEPTH
            )
            figures["route_change"] = {**changed, "prefix_tokens": depth.longest}
            out.results.append(result)
    out.figures["depth"] = figures


def scenario_record(depth: Depth) -> dict[str, Any]:
    return {
        "context": depth.context,
        "prompt_tokens": list(depth.prompt_tokens),
        "ubatch": depth.ubatch,
        "decode_tokens": depth.decode_tokens,
        "seed": depth.seed,
    }


def _monolithic(plan: Plan, cmd: WorkerCommand, depth: Depth) -> tuple[_AtDepth, dict[int, list[int]]]:
    """The monolithic worker at depth; it also tokenizes the scenario's passage (every stage holds the
    vocabulary, and the reference's tokens are the ones every placement is fed)."""
    mono = plan.recipe.monolithic
    with plan.where().start(cmd, mono, f"depth-{mono.name}") as pipe:
        prompts = depth_prompt.prompts(depth.seed, depth.prompt_tokens, pipe.clients[0].tokenize)
        at = _traces(pipe.clients, routes.RELAYED, reach(pipe), prompts, depth, "f32")
        switched = _switch(pipe.clients, at.traces[depth.longest], prompts[depth.longest], depth, "f32")
        return dataclasses.replace(at, route_change=switched), prompts


def _switch(
    clients: Sequence[Any], trace: DepthTrace, prompt: list[int], depth: Depth, dtype: str
) -> drive.RouteChange:
    """The route change at depth: the epoch changes halfway through the decode after ``prompt``; the
    uninterrupted session is ``trace``, the same prompt's run at depth on these stages."""
    half = max(1, depth.decode_tokens // 2)
    return drive.route_change(
        clients, prompt, depth.decode_tokens, half, boundary_dtype=dtype, uninterrupted=trace.tokens
    )


def _staged(
    plan: Plan, cmd: WorkerCommand, p: Placement, prompts: Mapping[int, list[int]], depth: Depth
) -> _AtDepth:
    dtype, route = plan.recipe.dtype_of(p), routes.spec_named(p.forwarding)
    other = routes.RELAYED if route.name == PIPELINED else routes.spec_named(PIPELINED)
    with plan.where().start(cmd, p, f"depth-{p.name}") as pipe:
        at = _traces(pipe.clients, route, reach(pipe), prompts, depth, dtype)
        longest = prompts[depth.longest]
        again = run_at_depth(pipe.clients, longest, 1, route=other, reach=reach(pipe), boundary_dtype=dtype)
        changed = None
        if p.name == switching_placement(plan.recipe.at_depth, plan.recipe.route_change):
            changed = _switch(pipe.clients, at.traces[depth.longest], longest, depth, dtype)
    return dataclasses.replace(at, other=again, other_route=other.name, route_change=changed)


def switching_placement(at_depth: Sequence[Placement], route_change: RouteChange | None) -> str | None:
    """Where the route change runs at depth: the recipe's route-change placement where the scenario runs
    it, else the scenario's first placement (None: no placement at depth)."""
    names = [p.name for p in at_depth]
    if route_change is not None and route_change.placement in names:
        return route_change.placement
    return names[0] if names else None


def prefill_figures(at: _AtDepth, route: str, longest: int) -> dict[str, Any]:
    """The longest prompt's prefill pipelined and not: speed of each and how far apart their logits are
    (the last row of every pass; the same requests on the same stages, so bitwise on the CPU)."""
    assert at.other is not None
    own = at.traces[longest]
    pipelined, plain = (own, at.other) if route == PIPELINED else (at.other, own)
    rows = plain.prefill_passes
    a, b = plain.logits[:rows], pipelined.logits[:rows]
    return {
        "prompt_tokens": longest,
        "passes": rows,
        "unpipelined_tok_s": plain.prefill_tok_s,
        "pipelined_tok_s": pipelined.prefill_tok_s,
        "speedup": pipelined.prefill_tok_s / plain.prefill_tok_s,
        "bitwise": bool(np.array_equal(a, b)),
        "logits_nmse": metrics.nmse(a, b),
    }


def _traces(
    clients: Sequence[Any],
    route: routes.RouteSpec,
    to: routes.Reach,
    prompts: Mapping[int, list[int]],
    depth: Depth,
    dtype: str,
) -> _AtDepth:
    t0 = time.perf_counter()
    traces = {
        n: run_at_depth(clients, prompt, depth.decode_tokens, route=route, reach=to, boundary_dtype=dtype)
        for n, prompt in sorted(prompts.items())
    }
    return _AtDepth(infos=drive.describe(clients), traces=traces, seconds=time.perf_counter() - t0)


def parity_figures(ref: Mapping[int, DepthTrace], cur: Mapping[int, DepthTrace]) -> dict[str, Any]:
    """Every prompt length's judged rows up to the first greedy divergence (after it the two runs feed
    different tokens), the staging-parity figures over all of them, and the worst greedy match."""
    a_rows, b_rows, greedy = [], [], []
    for n, r in ref.items():
        c = cur[n]
        rows = r.logits.shape[0] - len(r.tokens) + 1 + metrics.common_prefix(r.tokens, c.tokens)
        rows = min(rows, r.logits.shape[0])
        a_rows.append(r.logits[:rows])
        b_rows.append(c.logits[:rows])
        greedy.append(metrics.greedy_match(r.tokens, c.tokens))
    figures = logit_figures(np.concatenate(a_rows), np.concatenate(b_rows))
    return {**figures, "greedy_match": min(greedy)}


def kv_bytes_of(infos: Sequence[StageInfo]) -> list[int]:
    """The KV bytes each worker reported holding, in stage order."""
    return [int(i.memory.kv_bytes) for i in infos]


def kv_figures(ref: Sequence[StageInfo], cur: Sequence[StageInfo]) -> dict[str, Any]:
    """The stages' KV summed against the monolithic worker's (each stage's own figure is in _record)."""
    stages, mono = sum(kv_bytes_of(cur)), sum(kv_bytes_of(ref))
    faults = kv_stages.stage_faults(ref[0], cur) if len(ref) == 1 else []
    return {
        "kv_bytes_sum": stages,
        "kv_bytes_monolithic": mono,
        "kv_bytes_difference": abs(stages - mono),
        "kv_stage_faults": faults,
    }


def judge(plan: Plan, p: Placement, mono: _AtDepth, staged: _AtDepth) -> tuple[dict[str, Any], list[Result]]:
    """The placement's record at depth and its two results."""
    parity = parity_figures(mono.traces, staged.traces)
    longest = max(mono.traces)
    prefill = prefill_figures(staged, p.forwarding, longest)
    parity["pipelined_logits_nmse"] = prefill["logits_nmse"]
    record = {
        "name": p.name,
        "stages": [list(s) for s in p.stages],
        "parity": parity,
        "prefill": prefill,
        **kv_figures(mono.infos, staged.infos),
        **_record(staged),
    }
    limits = plan.hardware_class.staging_parity_for(plan.recipe.dtype_of(p))
    checks = [
        *gates.logit_parity_checks(limits),
        gates.AtMost(
            name="pipelined prefill logits NMSE", metric="pipelined_logits_nmse", limit=limits.logits_nmse_max
        ),
    ]
    parity_result = gates.evaluate(DEPTH_PARITY, p.name, checks, parity, duration_s=staged.seconds)
    results = [parity_result, kv_result(p, record, plan.recipe.depth)]
    if plan.recipe.architecture in state.CENSUS_ARCHITECTURES:
        exercised = plan.recipe.depth.exercised if plan.recipe.depth is not None else None
        results.append(state.judge(p, state.census_of(mono.infos), staged.infos, exercised))
    return record, results


def kv_result(p: Placement, kv: Mapping[str, Any], depth: Depth | None) -> Result:
    """PASS when the stages' KV sums to the monolithic worker's and each stage's, layer by layer, is
    the monolithic worker's for its layers (certify/kv_stages.py); a FAIL names the stages that differ
    and lists what each stage holds.  ``kv``: kv_figures with each stage's ``kv_bytes``."""
    faults = list(kv.get("kv_stage_faults", []))
    checks = [
        gates.AtMost(name="KV bytes off the monolithic worker's", metric="kv_bytes_difference", limit=0),
        gates.AtMost(name="stages whose memory differs by layer", metric="kv_stages_differing", limit=0),
    ]
    figures = {"kv_bytes_difference": kv["kv_bytes_difference"], "kv_stages_differing": len(faults)}
    result = gates.evaluate(KV_AT_DEPTH, p.name, checks, figures)
    if result.status is Status.PASS:
        return result
    held = ", ".join(
        f"stage {k} (layers {b}:{e}) {n} bytes"
        for k, ((b, e), n) in enumerate(zip(p.stages, kv["kv_bytes"], strict=True))
    )
    context = depth.context if depth is not None else 0
    reason = "; ".join(
        [
            *faults,
            f"at a context of {context} the stages hold {kv['kv_bytes_sum']} bytes of KV, the monolithic "
            f"worker {kv['kv_bytes_monolithic']}: {held}",
        ]
    )
    return dataclasses.replace(result, reason=reason)


def _record(run: _AtDepth) -> dict[str, Any]:
    """What the report shows of one placement's run at depth, per prompt length, and the state its
    workers counted (certify/state.py; empty where they kept no census)."""
    return {
        "state": state.summary(state.census_of(run.infos), state.KINDS if run.census else ()),
        "kv_bytes": kv_bytes_of(run.infos),
        "n_ctx": [int(i.n_ctx) for i in run.infos],
        "prompts": [
            {
                "tokens": n,
                "passes": t.prefill_passes,
                "prefill_s": t.prefill_seconds,
                "prefill_tok_s": t.prefill_tok_s,
                "decode_tok_s": (len(t.tokens) - 1) / t.decode_seconds if t.decode_seconds > 0 else None,
                "judged_positions": len(t.positions),
                "held_bytes": list(t.held_bytes),
            }
            for n, t in sorted(run.traces.items())
        ],
    }
