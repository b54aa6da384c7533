"""The driver: run prompts through a placement's running stages and record what the gates need.

How a pass travels is the route's business (pipeline/routes.py: relayed, chained, ring, each with
its own options); every function here takes a route spec (``route=``, default relayed) and the
placement's ``reach`` (how the stages reach each other and where the driver's sink listens) and never
asks which kind of route it holds.  A route that decodes by itself (a ring) chooses the tokens after
the prefill; with any other the driver decodes pass by pass.

Public API (numpy only; the gate math lives in certify/gates.py):
  * ``run_placement(stages, prompts, n_decode, capture=(), boundary_dtype="f32") -> Trace``
    prefill + greedy decode per prompt: last-stage logits for every position, the boundary at every
    seam, captured residuals, greedy tokens, timings.  Run it on the monolithic stage with
    ``capture=<the cut layers>`` to get the reference residuals the staged boundaries are compared to.
  * ``measure_speed(stages, prompt, n_decode, repetitions=5, warmup=1) -> SpeedSamples``
  * ``route_change(stages, prompt, n_decode, switch_at, after=None) -> RouteChange`` (relayed: the
    epoch logic lives in each stage and is the same whichever way the boundary travels)

Positions: prompt positions are 0..P-1; decode step i feeds the token chosen at step i at position
P+i.  With ``all_logits`` the trace holds P + n_decode - 1 logits rows (every position fed), else
n_decode rows (the last prompt position and each decode step).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import overload

import numpy as np

from core.errors import ConfigurationError
from pipeline.routes import LOOPBACK, RELAYED, Pass, PassOptions, Reach, Route, RouteSpec, Step, chunked
from worker.client import SessionFigures, StageClient, StageFailed, StageInfo

__all__ = ["Step", "Reach", "describe", "run_placement", "measure_speed", "route_change"]


@dataclass(frozen=True, kw_only=True)
class PromptTrace:
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]  # the greedy continuation (n_decode tokens; under teacher forcing, the fed ones)
    logit_positions: tuple[int, ...]  # the position each logits row belongs to
    logits: np.ndarray  # [rows, n_vocab] float32
    boundaries: dict[int, np.ndarray]  # cut layer -> [positions, width] float32, the seam's traffic
    captures: dict[int, np.ndarray]  # layer -> [positions, width] float32, residual entering it
    prefill: Step
    decode: tuple[Step, ...]
    # what each stage held of the session once it was decoded (the Session RPC): positions and state
    # bytes, the catalog's measured KV bytes per position; () from workers that predate the RPC
    held: tuple[SessionFigures, ...] = ()

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill.n_tokens / self.prefill.wall_seconds

    @property
    def decode_tok_s(self) -> float:
        """Decode steps per second (llama-bench's tg counts the same thing: one token per pass)."""
        seconds = sum(s.wall_seconds for s in self.decode)
        return len(self.decode) / seconds if seconds > 0 else float("nan")


@dataclass(frozen=True, kw_only=True)
class Trace:
    placement: tuple[tuple[int, int], ...]
    cuts: tuple[int, ...]  # the first layer of every stage but the first
    boundary_dtype: str
    infos: tuple[StageInfo, ...]
    prompts: tuple[PromptTrace, ...]
    forwarding: str = RELAYED.name
    # the route's record (routes.Route.record)
    route: Mapping[str, str] = field(default_factory=dict[str, str])

    def stage_compute_seconds(self) -> tuple[float, ...]:
        """Total worker compute per stage over every prompt, prefill and decode."""
        total = np.zeros(len(self.placement))
        for p in self.prompts:
            for step in (p.prefill, *p.decode):
                total += step.stage_compute
        return tuple(float(v) for v in total)

    def seam_bytes(self) -> tuple[int, ...]:
        """Total boundary payload bytes per seam over every prompt."""
        total = [0] * len(self.cuts)
        for p in self.prompts:
            for step in (p.prefill, *p.decode):
                total = [a + b for a, b in zip(total, step.seam_bytes, strict=True)]
        return tuple(total)


@dataclass(frozen=True, kw_only=True)
class SpeedSamples:
    """One value per timed repetition (warm-up runs excluded); summarise with certify.metrics.median_iqr."""

    n_prompt: int
    n_decode: int
    prefill_tok_s: tuple[float, ...]
    decode_tok_s: tuple[float, ...]
    seam_seconds: tuple[tuple[float, ...], ...]  # [rep][seam]: median over that rep's decode steps
    seam_bytes_per_token: tuple[int, ...]  # per seam, one decode token (the physical model)
    stage_compute_per_token: tuple[tuple[float, ...], ...]  # [rep][stage]: median decode compute
    forwarding: str = RELAYED.name
    crossings_per_token: int = 0  # one-way network messages on one decode token's critical path
    # what the route saw (routes.Route.observed)
    observed: Mapping[str, str] = field(default_factory=dict[str, str])


@dataclass(frozen=True, kw_only=True)
class RouteChange:
    reference: tuple[int, ...]  # tokens of one uninterrupted session
    switched: tuple[int, ...]  # tokens when the route epoch changes after ``switch_at`` tokens
    switch_at: int
    reprefill_tokens: int  # positions re-prefilled under the new epoch
    cache_miss: str  # how the new epoch answered a request that assumed the old KV (status code)
    reprefill_seconds: float | None = (
        None  # the re-prefill's wall time (None: a record made before it was kept)
    )

    @property
    def identical(self) -> bool:
        return self.reference == self.switched


# Placement checks --------------------------------------------------------------------------------
def describe(stages: Sequence[StageClient]) -> tuple[StageInfo, ...]:
    """Info of every stage, checked to form one pipeline: contiguous ranges from 0 to n_layer, the
    first stage first, the last stage last, one boundary width."""
    if not stages:
        raise ConfigurationError("a placement needs at least one stage")
    infos = tuple(s.info() for s in stages)
    expect = 0
    for k, (stage, info) in enumerate(zip(stages, infos, strict=True)):
        problems: list[str] = []
        if info.layer_begin != expect or info.layer_end <= info.layer_begin:
            problems.append(f"owns {info.layer_begin}:{info.layer_end}, expected to start at {expect}")
        if info.first_stage != (k == 0) or info.last_stage != (k == len(stages) - 1):
            problems.append(f"says first={info.first_stage} last={info.last_stage} at position {k}")
        if info.n_layer != infos[0].n_layer or info.boundary_width != infos[0].boundary_width:
            problems.append("disagrees with stage 0 on n_layer or boundary width")
        if problems:
            raise stage.failure("WRONG_STAGE", "; ".join(problems))
        expect = info.layer_end
    if expect != infos[0].n_layer:
        detail = f"the placement ends at layer {expect} of {infos[0].n_layer}"
        raise stages[-1].failure("WRONG_STAGE", detail)
    return infos


def _session(tag: str) -> str:
    return f"dgr-{tag}-{uuid.uuid4().hex[:12]}"


# Passes ------------------------------------------------------------------------------------------
# A reset made while a pass unwinds (a stage failed, SIGTERM, Ctrl-C) is best effort: a stage that does
# not answer within this is hung, or busy with the very pass that failed, and waiting out the call's
# deadline (30 s a stage) held a cancelled certification that long before it stopped its workers.
UNWIND_RESET_S = 2.0


def _reset_all(stages: Sequence[StageClient], session: str, *, quiet: bool, deadline: float = 30.0) -> None:
    for stage in stages:
        try:
            stage.reset(session, deadline=deadline)
        except StageFailed:
            if not quiet:
                raise


def fits(infos: Sequence[StageInfo], n_positions: int) -> None:
    """ConfigurationError naming the first stage whose context holds fewer than ``n_positions`` (a
    stage reporting no context, 0, is not checked): every run checks before its first pass, so a
    prompt too long fails in one line instead of in a worker's decode."""
    for k, info in enumerate(infos):
        if info.n_ctx and n_positions > info.n_ctx:
            raise ConfigurationError(
                f"stage {k} (layers {info.layer_begin}:{info.layer_end}) holds {info.n_ctx} positions, "
                f"the run needs {n_positions}",
                hint="start its worker with a larger --ctx or shorten the prompts",
            )


def _merge(parts: Sequence[Pass], *, all_logits: bool) -> Pass:
    """One prefill split into chunks of at most n_batch positions, seen as one pass."""
    if len(parts) == 1:
        return parts[0]
    steps = [p.step for p in parts]

    return Pass(
        logits=np.concatenate([p.logits for p in parts]) if all_logits else parts[-1].logits,
        boundaries=[np.concatenate(seam) for seam in zip(*(p.boundaries for p in parts), strict=True)],
        captures={il: np.concatenate([p.captures[il] for p in parts]) for il in parts[0].captures},
        step=Step(
            n_tokens=sum(s.n_tokens for s in steps),
            wall_seconds=sum(s.wall_seconds for s in steps),
            stage_wall=_summed(s.stage_wall for s in steps),
            stage_compute=_summed(s.stage_compute for s in steps),
            seam_bytes=_summed(s.seam_bytes for s in steps),
            seam_seconds=_summed(s.seam_seconds for s in steps),
            crossings=sum(s.crossings for s in steps),
            forwarding=steps[0].forwarding,
        ),
        draft=parts[-1].draft,
    )


def _greedy(
    route: Route,
    prompt: Sequence[int],
    n_decode: int,
    options: PassOptions,
    *,
    session: str,
    epoch: int,
    forced: Sequence[int] | None = None,
) -> tuple[list[int], list[Pass]]:
    """Prefill ``prompt`` at positions 0.. (in chunks of the smallest n_batch of the stages), then
    decode until n_decode tokens are chosen (``forced``: fed instead of the argmax, teacher forcing).
    Every acknowledgement is in before this returns."""
    if not prompt:
        raise ConfigurationError("a prompt needs at least one token")
    if n_decode < 1:
        raise ConfigurationError("decode length must be at least 1")
    if forced is not None and len(forced) != n_decode:
        raise ConfigurationError(f"teacher forcing needs {n_decode} tokens, got {len(forced)}")
    try:
        out = _greedy_passes(route, prompt, n_decode, options, session=session, epoch=epoch, forced=forced)
    except BaseException:
        route.drain(quiet=True)
        raise
    route.drain()
    return out


def _greedy_passes(
    route: Route,
    prompt: Sequence[int],
    n_decode: int,
    options: PassOptions,
    *,
    session: str,
    epoch: int,
    forced: Sequence[int] | None,
) -> tuple[list[int], list[Pass]]:
    def pick(step: int, logits: np.ndarray) -> int:
        return int(forced[step]) if forced is not None else int(np.argmax(logits[-1]))

    passes = [_prefill(route, prompt, session, epoch, options)]
    chosen = [pick(0, passes[-1].logits)]
    if n_decode > 1 and forced is None:  # a route whose stages decode by themselves chooses the rest
        options_one = replace(options, all_logits=True, capture=())
        decoded = route.decode(session, epoch, len(prompt), chosen[0], n_decode - 1, options_one)
        if decoded is not None:
            return chosen + list(decoded.tokens), passes + list(decoded.passes)
    step_options = replace(options, all_logits=True)
    while len(chosen) < n_decode:
        pos = len(prompt) + len(chosen) - 1
        passes.append(route.forward(session, epoch, [pos], [chosen[-1]], step_options))
        chosen.append(pick(len(chosen), passes[-1].logits))
    return chosen, passes


@overload
def _summed(rows: Iterable[tuple[int, ...]]) -> tuple[int, ...]: ...
@overload
def _summed(rows: Iterable[tuple[float, ...]]) -> tuple[float, ...]: ...
def _summed(rows: Iterable[tuple[float, ...]]) -> tuple[float, ...]:
    """Per column, the sum of ``rows`` (the steps' per-stage or per-seam figures: bytes stay ints)."""
    columns: Iterable[tuple[float, ...]] = zip(*rows, strict=True)
    return tuple(sum(column) for column in columns)


def _prefill(route: Route, prompt: Sequence[int], session: str, epoch: int, options: PassOptions) -> Pass:
    """``prompt`` at positions 0.. in chunks of the smallest n_batch of the stages, seen as one pass
    (``options.draft``: an MTP last stage drafts after the last chunk only)."""
    chunks = chunked(prompt, batch_of(route.infos, len(prompt)))
    return _merge(route.prefill(session, epoch, chunks, options), all_logits=options.all_logits)


def batch_of(infos: Sequence[StageInfo], n_positions: int) -> int:
    """The most positions one pass may carry: the smallest n_batch of the stages (0: no limit)."""
    return min((i.n_batch for i in infos if i.n_batch > 0), default=n_positions)


# Public API --------------------------------------------------------------------------------------
def run_placement(
    stages: Sequence[StageClient],
    prompts: Sequence[Sequence[int]],
    n_decode: int,
    *,
    capture: Sequence[int] = (),
    boundary_dtype: str = "f32",
    all_logits: bool = True,
    epoch: int = 1,
    route: RouteSpec = RELAYED,
    reach: Reach = LOOPBACK,
    forced: Sequence[Sequence[int]] | None = None,
) -> Trace:
    """Prefill then greedy-decode every prompt (one fresh session each, reset afterwards).

    ``forced`` (one continuation of n_decode tokens per prompt): teacher forcing, each decode step fed
    the given token instead of this run's argmax, so the positions see the same inputs as the run that
    chose them (a backend compared with the reference it should agree with, row by row)."""
    infos = describe(stages)
    fits(infos, max(len(p) for p in prompts) + n_decode)
    wanted = _capture_layers(capture, infos, route)
    _check_forced(forced, prompts, route)
    options = PassOptions(
        boundary_dtype=boundary_dtype, all_logits=all_logits, capture=wanted, keep_boundaries=True
    )
    with route.open(stages, infos, reach) as opened:
        traces = [
            _prompt_trace(
                opened,
                prompt,
                n_decode,
                options,
                tag=f"p{i}",
                epoch=epoch,
                forced=None if forced is None else forced[i],
            )
            for i, prompt in enumerate(prompts)
        ]
        recorded = opened.record()
    return Trace(
        placement=tuple((i.layer_begin, i.layer_end) for i in infos),
        cuts=tuple(i.layer_begin for i in infos[1:]),
        boundary_dtype=boundary_dtype,
        infos=infos,
        prompts=tuple(traces),
        forwarding=route.name,
        route=recorded,
    )


def _capture_layers(capture: Sequence[int], infos: Sequence[StageInfo], route: RouteSpec) -> tuple[int, ...]:
    wanted = tuple(sorted(set(int(il) for il in capture)))
    if any(not 0 <= il < infos[0].n_layer for il in wanted):
        raise ConfigurationError(f"capture layers {list(wanted)} fall outside 0:{infos[0].n_layer}")
    if wanted and not route.captures:
        raise ConfigurationError(
            f"layer captures come back only on relayed passes, not {route.name} ones (they are for the "
            "monolithic reference)"
        )
    return wanted


def _check_forced(
    forced: Sequence[Sequence[int]] | None, prompts: Sequence[Sequence[int]], route: RouteSpec
) -> None:
    if forced is None:
        return
    if len(forced) != len(prompts):
        raise ConfigurationError(f"teacher forcing needs one continuation per prompt ({len(prompts)})")
    if route.picks_tokens:
        raise ConfigurationError(
            f"teacher forcing needs a route that is fed its tokens, not {route.name} (its stages pick them)"
        )


def _prompt_trace(
    route: Route,
    prompt: Sequence[int],
    n_decode: int,
    options: PassOptions,
    *,
    tag: str,
    epoch: int,
    forced: Sequence[int] | None = None,
) -> PromptTrace:
    session = _session(tag)
    try:
        tokens, passes = _greedy(
            route, prompt, n_decode, options, session=session, epoch=epoch, forced=forced
        )
    except BaseException:
        abandon_session(route.stages, session)
        raise
    held = held_by(route.stages, session)
    _reset_all(route.stages, session, quiet=False)
    first = list(range(len(prompt))) if options.all_logits else [len(prompt) - 1]
    return PromptTrace(
        prompt=tuple(int(t) for t in prompt),
        tokens=tuple(tokens),
        logit_positions=tuple(first + [len(prompt) + j for j in range(n_decode - 1)]),
        logits=np.concatenate([p.logits for p in passes]),
        boundaries={
            info.layer_begin: np.concatenate([p.boundaries[k] for p in passes])
            for k, info in enumerate(route.infos[1:])
        },
        captures={il: np.concatenate([p.captures[il] for p in passes]) for il in options.capture},
        prefill=passes[0].step,
        decode=tuple(p.step for p in passes[1:]),
        held=held,
    )


def held_by(stages: Sequence[StageClient], session: str) -> tuple[SessionFigures, ...]:
    """What every stage holds of ``session`` now; () where a worker predates the Session RPC (an
    attached worker of an older build: its capacity is then the allocation's, not a measurement)."""
    try:
        return tuple(stage.session(session) for stage in stages)
    except StageFailed as exc:
        if exc.code == "UNIMPLEMENTED":
            return ()
        raise


def measure_speed(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    *,
    repetitions: int = 5,
    warmup: int = 1,
    boundary_dtype: str = "f32",
    route: RouteSpec = RELAYED,
    reach: Reach = LOOPBACK,
) -> SpeedSamples:
    """Warm up, then time ``repetitions`` fresh sessions of prefill + (n_decode - 1) decode steps.

    Only the last logits row comes back (as in real serving), and boundaries are not kept.  A route
    whose deliveries carry tokens only (routes.Ring(logits=False)) holds no token to its logits row,
    so every repetition must choose the same tokens (BAD_REPLY if not)."""
    if repetitions < 1 or n_decode < 2:
        raise ConfigurationError("speed needs at least one repetition and a decode length of at least 2")
    infos = describe(stages)
    fits(infos, len(prompt) + n_decode)
    runs: list[list[Pass]] = []
    chosen: set[tuple[int, ...]] = set()
    with route.open(stages, infos, reach) as opened:
        for r in range(warmup + repetitions):
            tokens, passes = _speed_repetition(opened, prompt, n_decode, boundary_dtype, tag=f"speed{r}")
            chosen.add(tuple(tokens))
            if r >= warmup:
                runs.append(passes)
        observed = opened.observed()
    # a route whose tokens were held to no logits row: the same prompt, greedy, a fresh session each
    # time, so every repetition must give one answer (other routes checked each token already)
    if not route.checks_tokens and len(chosen) > 1:
        raise stages[-1].failure(
            "BAD_REPLY",
            f"{len(chosen)} different greedy continuations of one prompt over {warmup + repetitions} "
            "repetitions",
        )
    return _samples(runs, len(prompt), n_decode, len(stages), route.name, observed)


def _speed_repetition(
    route: Route, prompt: Sequence[int], n_decode: int, boundary_dtype: str, *, tag: str
) -> tuple[list[int], list[Pass]]:
    """One fresh session of prefill + decode, its session freed after (best effort when it failed)."""
    session = _session(tag)
    try:
        got = _greedy(
            route, prompt, n_decode, PassOptions(boundary_dtype=boundary_dtype), session=session, epoch=1
        )
    except BaseException:
        abandon_session(route.stages, session)
        raise
    _reset_all(route.stages, session, quiet=True)
    return got


def _samples(
    runs: Sequence[Sequence[Pass]],
    n_prompt: int,
    n_decode: int,
    n_stages: int,
    forwarding: str,
    observed: Mapping[str, str],
) -> SpeedSamples:
    """Each timed repetition's prefill and decode rates, seam times and stage compute (medians over its
    decode steps)."""
    prefill: list[float] = []
    decode: list[float] = []
    seams: list[tuple[float, ...]] = []
    compute: list[tuple[float, ...]] = []
    for passes in runs:
        steps = [p.step for p in passes[1:]]
        prefill.append(passes[0].step.n_tokens / passes[0].step.wall_seconds)
        decode.append(len(steps) / sum(s.wall_seconds for s in steps))
        seams.append(tuple(float(np.median([s.seam_seconds[j] for s in steps])) for j in range(n_stages - 1)))
        compute.append(tuple(float(np.median([s.stage_compute[k] for s in steps])) for k in range(n_stages)))
    last = runs[-1][-1].step
    return SpeedSamples(
        n_prompt=n_prompt,
        n_decode=n_decode,
        prefill_tok_s=tuple(prefill),
        decode_tok_s=tuple(decode),
        seam_seconds=tuple(seams),
        seam_bytes_per_token=last.seam_bytes,
        stage_compute_per_token=tuple(compute),
        forwarding=forwarding,
        crossings_per_token=last.crossings,
        observed=dict(observed),
    )


def route_change(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    switch_at: int,
    *,
    after: Sequence[StageClient] | None = None,
    boundary_dtype: str = "f32",
    uninterrupted: Sequence[int] | None = None,
) -> RouteChange:
    """Decode ``switch_at`` tokens under epoch 1, switch to epoch 2 (on ``after``, default the same
    stages), re-prefill prompt + tokens so far, finish; compare with one uninterrupted session.
    ``uninterrupted``: that session's ``n_decode`` tokens where the caller already ran it on these stages
    (the depth scenario's own trace), so a long prompt is not prefilled once more for it."""
    _check_switch(n_decode, switch_at, uninterrupted)
    after = list(after) if after is not None else list(stages)
    infos, infos_after = describe(stages), describe(after)
    fits(infos, len(prompt) + n_decode)
    fits(infos_after, len(prompt) + n_decode)
    options = PassOptions(boundary_dtype=boundary_dtype)
    ref_session, session = _session("ref"), _session("route")
    with RELAYED.open(stages, infos) as before_route, RELAYED.open(after, infos_after) as after_route:
        try:
            reference = list(uninterrupted) if uninterrupted is not None else None
            if reference is None:
                reference, _ = _greedy(before_route, prompt, n_decode, options, session=ref_session, epoch=1)
            before, _ = _greedy(before_route, prompt, switch_at, options, session=session, epoch=1)
            miss = _old_kv_refused(after[0], session, len(prompt) + switch_at - 1, before[-1], boundary_dtype)
            history = list(prompt) + before
            rest, passes = _greedy(
                after_route, history, n_decode - switch_at, options, session=session, epoch=2
            )
        except BaseException:
            for group in {id(stages): stages, id(after): after}.values():
                abandon_session(group, ref_session)
                abandon_session(group, session)
            raise
        for group in {id(stages): stages, id(after): after}.values():
            _reset_all(group, ref_session, quiet=True)
            _reset_all(group, session, quiet=True)
    return RouteChange(
        reference=tuple(reference),
        switched=tuple(before + rest),
        switch_at=switch_at,
        reprefill_tokens=len(history),
        cache_miss=miss,
        reprefill_seconds=passes[0].step.wall_seconds,
    )


def _check_switch(n_decode: int, switch_at: int, uninterrupted: Sequence[int] | None) -> None:
    if not 1 <= switch_at < n_decode:
        raise ConfigurationError(f"switch_at must be within 1..{n_decode - 1}")
    if uninterrupted is not None and len(uninterrupted) != n_decode:
        raise ConfigurationError(f"an uninterrupted session of {n_decode} tokens, got {len(uninterrupted)}")


def _old_kv_refused(first: StageClient, session: str, position: int, token: int, boundary_dtype: str) -> str:
    """How the new epoch answers a request that continues the old epoch's KV: it has to refuse it
    (the status code), not reuse it ("ACCEPTED")."""
    try:
        first.forward(session, 2, [position], tokens=[token], boundary_dtype=boundary_dtype)
    except StageFailed as exc:
        if exc.code == "DIED":
            raise
        return exc.code
    return "ACCEPTED"


# For drivers of their own decode loops (pipeline.concurrency, pipeline.speculative) ---------------
def greedy_session(
    route: Route, prompt: Sequence[int], n_decode: int, *, session: str, boundary_dtype: str = "f32"
) -> tuple[list[int], np.ndarray]:
    """One session's prefill + greedy decode as a speed run makes it (last logits row of each pass, no
    boundaries kept): the tokens chosen and those rows.  The caller resets the session."""
    options = PassOptions(boundary_dtype=boundary_dtype)
    tokens, passes = _greedy(route, prompt, n_decode, options, session=session, epoch=1)
    return tokens, np.concatenate([p.logits for p in passes])


@dataclass(frozen=True, kw_only=True)
class Passed:
    """One pass as a decode loop of its own (pipeline/speculative.py) reads it."""

    logits: np.ndarray  # the last row (prefill) or every row (forward_pass)
    step: Step
    draft: tuple[int, ...] = ()  # an MTP last stage's drafts to follow the pass
    accepted: int = 0  # an MTP last stage's count of the pass's drafted tokens that stood


def passed(done: Pass) -> Passed:
    return Passed(logits=done.logits, step=done.step, draft=done.draft, accepted=done.accepted)


def prefill(
    route: Route,
    prompt: Sequence[int],
    *,
    session: str,
    epoch: int = 1,
    boundary_dtype: str = "f32",
    draft: int = 0,
) -> Passed:
    """The prompt's pass (for drivers of their own decode loop, pipeline/speculative.py): the last
    logits row, the step, and with ``draft`` the MTP last stage's drafts after it."""
    if not prompt:
        raise ConfigurationError("a prompt needs at least one token")
    done = _prefill(route, prompt, session, epoch, PassOptions(boundary_dtype=boundary_dtype, draft=draft))
    return Passed(logits=done.logits, step=done.step, draft=done.draft)


def forward_pass(
    route: Route,
    positions: Sequence[int],
    tokens: Sequence[int],
    *,
    session: str,
    epoch: int = 1,
    boundary_dtype: str = "f32",
    rewind: bool = False,
    draft: int = 0,
    drafted: int = 0,
) -> Passed:
    """One pass of ``tokens`` at ``positions`` through every stage: the logits of every row and the step.
    ``rewind``: the stages first take back the positions they hold from ``positions[0]`` on; ``drafted``
    / ``draft``: an MTP last stage verifies the pass's last tokens / drafts this many after it."""
    options = PassOptions(
        boundary_dtype=boundary_dtype, all_logits=True, rewind=rewind, draft=draft, drafted=drafted
    )
    return passed(route.forward(session, epoch, list(positions), list(tokens), options))


def new_session(tag: str) -> str:
    return _session(tag)


def reset_session(stages: Sequence[StageClient], session: str) -> None:
    _reset_all(stages, session, quiet=True)


def abandon_session(stages: Sequence[StageClient], session: str) -> None:
    """``reset_session`` for a session whose pass failed or was cancelled: stages that do not answer
    within UNWIND_RESET_S are left to the launcher, which stops the workers it started."""
    _reset_all(stages, session, quiet=True, deadline=UNWIND_RESET_S)
