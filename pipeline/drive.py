"""The driver: run prompts through a placement's running stages and record what the gates need.

Two ways to move a pass through the stages (``forwarding``):

* ``relayed`` (default): the driver relays every seam itself: stage k's boundary tensor comes back to
  the driver and goes, byte for byte as the worker sent it, into stage k+1's request.  Each stage
  costs two network crossings per pass (request in, reply out), and the trace keeps every boundary.
* ``chained``: the driver sends one request to stage 0 with the addresses of the stages after it
  and of the driver's sink (pipeline/sink.py); each stage forwards its boundary straight to the next
  and the last stage delivers the logits to the sink: n_stages + 1 crossings per pass.  Timings come
  from the stages' hop records (CLOCK_MONOTONIC stamps: seam k = arrival at stage k+1 minus hand-off
  at stage k, meaningful when every stage runs on this machine, network namespaces included).  For
  parity runs each hop also returns its boundary (``keep_boundaries``), outside the timed traffic's
  meaning but on the same wire.  Layer captures are relayed-only (the monolithic reference).
* ``ring`` (greedy decode only, pipeline/ring.py): the prefill as ``chained``, then the stages decode
  on their own: the last stage picks each token and starts the next pass at stage 0 (n_stages
  crossings per token); the driver reads the tokens and logits from its sink and checks each token
  against the argmax of its logits.  A decode step's wall time is the time between two deliveries.

Public API (numpy only; the gate math lives in certify/gates.py):
  * ``run_placement(stages, prompts, n_decode, capture=(), boundary_dtype="f32") -> Trace``
    prefill + greedy decode per prompt: last-stage logits for every position, the boundary at every
    seam, captured residuals, greedy tokens, timings.  Run it on the monolithic stage with
    ``capture=<the cut layers>`` to get the reference residuals the staged boundaries are compared to.
  * ``measure_speed(stages, prompt, n_decode, repetitions=5, warmup=1) -> SpeedSamples``
  * ``route_change(stages, prompt, n_decode, switch_at, after=None) -> RouteChange`` (relayed only:
    the epoch logic lives in each stage and is the same whichever way the boundary travels)

``run_placement`` and ``measure_speed`` take ``forwarding="relayed" | "chained" | "ring"``, ``addresses`` (how
the stages reach each other, default each client's address) and ``sink_host`` (where the driver's
sink listens; it must be reachable from the last stage).

Positions: prompt positions are 0..P-1; decode step i feeds the token chosen at step i at position
P+i.  With ``all_logits`` the trace holds P + n_decode - 1 logits rows (every position fed), else
n_decode rows (the last prompt position and each decode step).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigurationError
from pipeline.ring import RingRoute, ring_route
from pipeline.sink import ChainedPass, ChainRoute, chain_route
from worker.client import Forwarded, StageClient, StageFailed, StageInfo

FORWARDING = ("relayed", "chained", "ring")


@dataclass(frozen=True, kw_only=True)
class Step:
    """One pass of n_tokens positions through every stage."""

    n_tokens: int
    wall_seconds: float  # driver-side, first request sent to last reply decoded
    stage_wall: tuple[float, ...]  # per stage: the client's round trip of its Forward
    stage_compute: tuple[float, ...]  # per stage: the worker's own llama_decode time
    seam_bytes: tuple[int, ...]  # per seam k (stage k -> k+1): boundary payload bytes
    # Per seam k.  Relayed: stage k+1's round trip minus its compute, i.e. moving seam k's boundary
    # in, plus stage k+1's reply out, plus gRPC overhead: what the seam costs beyond the work itself.
    # Chained: arrival at stage k+1 minus hand-off at stage k (one crossing; same-machine clocks).
    seam_seconds: tuple[float, ...]
    # One-way network messages on the critical path of the pass: relayed 2 x n_stages (request and
    # reply per stage), chained n_stages + 1 (into stage 0, each seam once, last stage to the sink).
    crossings: int = 0
    forwarding: str = "relayed"


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
    forwarding: str = "relayed"

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
    forwarding: str = "relayed"
    crossings_per_token: int = 0  # one-way network messages on one decode token's critical path
    ring_deliveries: str = ""  # a ring's: how its deliveries reached the driver (RingSink.deliveries_came_as)


@dataclass(frozen=True, kw_only=True)
class RouteChange:
    reference: tuple[int, ...]  # tokens of one uninterrupted session
    switched: tuple[int, ...]  # tokens when the route epoch changes after ``switch_at`` tokens
    switch_at: int
    reprefill_tokens: int  # positions re-prefilled under the new epoch
    cache_miss: str  # how the new epoch answered a request that assumed the old KV (status code)

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
        problems = []
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


# One pass ----------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class _Pass:
    logits: np.ndarray
    boundaries: list[np.ndarray]
    captures: dict[int, np.ndarray]
    step: Step
    draft: tuple[int, ...] = ()  # MTP last stage: the tokens it drafted to follow the pass
    accepted: int = 0  # MTP last stage: the pass's drafted tokens that stood


def _forward_all(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    session: str,
    epoch: int,
    positions: list[int],
    tokens: list[int],
    *,
    boundary_dtype: str,
    all_logits: bool,
    capture: Sequence[int],
    keep_boundaries: bool = True,
    route: ChainRoute | None = None,
    rewind: bool = False,
    draft: int = 0,
    drafted: int = 0,
) -> _Pass:
    if route is not None:
        return _forward_chained(
            route,
            session,
            epoch,
            positions,
            tokens,
            boundary_dtype=boundary_dtype,
            all_logits=all_logits,
            keep_boundaries=keep_boundaries,
            rewind=rewind,
            draft=draft,
            drafted=drafted,
        )
    n, rows = len(positions), len(positions) if all_logits else 1
    width = infos[0].boundary_width
    replies: list[Forwarded] = []
    boundaries: list[np.ndarray] = []
    captures: dict[int, np.ndarray] = {}
    started = time.perf_counter()
    relay = None
    for k, (stage, info) in enumerate(zip(stages, infos, strict=True)):
        mine = [il for il in capture if info.layer_begin <= il < info.layer_end]
        reply = stage.forward(
            session,
            epoch,
            positions,
            tokens=tokens if (k == 0 or info.needs_token_sideband or info.mtp) else (),
            boundary=relay,
            boundary_dtype=boundary_dtype,
            all_logits=all_logits,
            capture_layers=mine,
            rewind=rewind,
            draft=draft if info.last_stage else 0,
            drafted=drafted if info.last_stage else 0,
        )
        if sorted(reply.captures) != sorted(mine):
            raise stage.failure("BAD_REPLY", f"asked to capture layers {mine}, got {sorted(reply.captures)}")
        for il, arr in reply.captures.items():
            # A capture is n_embd wide (DeepSeek-V4: the mean of its hc residual copies); a boundary
            # may be wider (hc_mult * n_embd), so the two compare directly only on dense models.
            captures[il] = _expect_shape(stage, f"capture of layer {il}", arr, (n, info.n_embd))
        if info.last_stage:
            _expect_shape(stage, "logits", reply.logits, (rows, info.n_vocab))
        else:
            _expect_shape(stage, "boundary", reply.boundary, (n, width))
            if keep_boundaries:
                boundaries.append(reply.boundary)
            relay = reply.boundary_wire
        replies.append(reply)
    wall = time.perf_counter() - started
    step = Step(
        n_tokens=n,
        wall_seconds=wall,
        stage_wall=tuple(r.wall_seconds for r in replies),
        stage_compute=tuple(r.compute_seconds for r in replies),
        seam_bytes=tuple(r.boundary_bytes for r in replies[:-1]),
        seam_seconds=tuple(max(0.0, r.wall_seconds - r.compute_seconds) for r in replies[1:]),
        crossings=2 * len(replies),
    )
    assert replies[-1].logits is not None
    return _Pass(
        logits=replies[-1].logits,
        boundaries=boundaries,
        captures=captures,
        step=step,
        draft=replies[-1].draft,
        accepted=replies[-1].accepted,
    )


def _forward_chained(
    route: ChainRoute,
    session: str,
    epoch: int,
    positions: list[int],
    tokens: list[int],
    *,
    boundary_dtype: str,
    all_logits: bool,
    keep_boundaries: bool,
    rewind: bool = False,
    draft: int = 0,
    drafted: int = 0,
) -> _Pass:
    got = route.run(
        session,
        epoch,
        positions,
        tokens,
        boundary_dtype=boundary_dtype,
        all_logits=all_logits,
        keep_boundaries=keep_boundaries,
        rewind=rewind,
        draft=draft,
        drafted=drafted,
    )
    done = _delivered(route, got, len(positions), len(positions) if all_logits else 1)
    done.draft, done.accepted = got.draft, got.accepted
    return done


def _delivered(route: ChainRoute, got: ChainedPass, n: int, rows: int, *, ring: bool = False) -> _Pass:
    """A chained pass (or one token of a ring: n_stages crossings, the delivery off the critical path)
    as a _Pass."""
    # Everything arrives in the last stage's delivery, so a bad shape is reported against that stage.
    last = route.stages[-1]
    logits = _expect_shape(last, "logits", got.logits, (rows, route.infos[-1].n_vocab))
    width = route.infos[0].boundary_width
    boundaries = [
        _expect_shape(last, f"boundary of stage {k}", b, (n, width)) for k, b in enumerate(got.boundaries)
    ]
    hops = got.hops
    step = Step(
        n_tokens=n,
        wall_seconds=got.wall_seconds,
        # time inside each stage, request arrival to hand-off (compute plus encoding the boundary)
        stage_wall=tuple((h.sent_ns - h.received_ns) / 1e9 for h in hops),
        stage_compute=tuple(float(h.compute_seconds) for h in hops),
        seam_bytes=tuple(int(h.boundary_bytes) for h in hops[:-1]),
        seam_seconds=tuple((b.received_ns - a.sent_ns) / 1e9 for a, b in zip(hops, hops[1:], strict=False)),
        crossings=len(hops) if ring else len(hops) + 1,
        forwarding="ring" if ring else "chained",
    )
    return _Pass(logits=logits, boundaries=boundaries, captures={}, step=step)


def _expect_shape(
    stage: StageClient, what: str, arr: np.ndarray | None, shape: tuple[int, int]
) -> np.ndarray:
    """``arr`` when it has the shape the pass needs, else BAD_REPLY against the stage it came from."""
    if arr is None or arr.shape != shape:
        got = None if arr is None else list(arr.shape)
        raise stage.failure("BAD_REPLY", f"{what} {got}, expected {list(shape)}")
    return arr


@contextmanager
def _routing(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    forwarding: str,
    addresses: Sequence[str] | None,
    sink_host: str,
    *,
    ring_streams: bool = True,
    ring_driver_yields: bool = True,
    ring_delivery_stream: bool = True,
) -> Iterator[ChainRoute | None]:
    """None for relayed passes; for chained ones, a route with the driver's sink listening."""
    if forwarding not in FORWARDING:
        raise ConfigurationError(f"forwarding {forwarding!r} is not one of {', '.join(FORWARDING)}")
    if forwarding == "relayed":
        yield None
        return
    if forwarding == "ring":
        with ring_route(
            stages,
            infos,
            addresses=addresses,
            sink_host=sink_host,
            streams=ring_streams,
            driver_yields=ring_driver_yields,
            delivery_stream=ring_delivery_stream,
        ) as route:
            yield route
        return
    with chain_route(stages, infos, addresses=addresses, sink_host=sink_host) as route:
        yield route


def _reset_all(stages: Sequence[StageClient], session: str, *, quiet: bool) -> None:
    for stage in stages:
        try:
            stage.reset(session)
        except StageFailed:
            if not quiet:
                raise


def _check_fits(infos: Sequence[StageInfo], n_positions: int) -> None:
    small = min(i.n_ctx for i in infos)
    if small and n_positions > small:
        raise ConfigurationError(
            f"{n_positions} positions do not fit the workers' context of {small}",
            hint="start the workers with a larger --ctx or shorten the prompts",
        )


def _merge(parts: Sequence[_Pass], *, all_logits: bool) -> _Pass:
    """One prefill split into chunks of at most n_batch positions, seen as one pass."""
    if len(parts) == 1:
        return parts[0]
    steps = [p.step for p in parts]

    def total(name: str) -> tuple:
        return tuple(sum(vals) for vals in zip(*(getattr(s, name) for s in steps), strict=True))

    return _Pass(
        logits=np.concatenate([p.logits for p in parts]) if all_logits else parts[-1].logits,
        boundaries=[np.concatenate(seam) for seam in zip(*(p.boundaries for p in parts), strict=True)],
        captures={il: np.concatenate([p.captures[il] for p in parts]) for il in parts[0].captures},
        step=Step(
            n_tokens=sum(s.n_tokens for s in steps),
            wall_seconds=sum(s.wall_seconds for s in steps),
            stage_wall=total("stage_wall"),
            stage_compute=total("stage_compute"),
            seam_bytes=total("seam_bytes"),
            seam_seconds=total("seam_seconds"),
            crossings=sum(s.crossings for s in steps),
            forwarding=steps[0].forwarding,
        ),
        draft=parts[-1].draft,
    )


def _greedy(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    n_decode: int,
    *,
    session: str,
    epoch: int,
    boundary_dtype: str,
    all_logits: bool,
    capture: Sequence[int],
    keep_boundaries: bool = True,
    route: ChainRoute | None = None,
    forced: Sequence[int] | None = None,
    ring_logits: bool = True,
) -> tuple[list[int], list[_Pass]]:
    """Prefill ``prompt`` at positions 0.. (in chunks of the smallest n_batch of the stages), then
    decode until n_decode tokens are chosen (``forced``: fed instead of the argmax, teacher forcing).
    Chained: every ack is in before this returns.  ``ring_logits=False``: a ring delivers tokens only
    (its passes' logits are [0, n_vocab])."""
    if not prompt:
        raise ConfigurationError("a prompt needs at least one token")
    if n_decode < 1:
        raise ConfigurationError("decode length must be at least 1")
    try:
        out = _greedy_passes(
            stages,
            infos,
            prompt,
            n_decode,
            session=session,
            epoch=epoch,
            boundary_dtype=boundary_dtype,
            all_logits=all_logits,
            capture=capture,
            keep_boundaries=keep_boundaries,
            route=route,
            forced=forced,
            ring_logits=ring_logits,
        )
    except BaseException:
        if route is not None:
            route.drain(quiet=True)
        raise
    if route is not None:
        route.drain()
    return out


def _greedy_passes(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    n_decode: int,
    *,
    session: str,
    epoch: int,
    boundary_dtype: str,
    all_logits: bool,
    capture: Sequence[int],
    keep_boundaries: bool,
    route: ChainRoute | None,
    forced: Sequence[int] | None,
    ring_logits: bool = True,
) -> tuple[list[int], list[_Pass]]:
    if forced is not None and len(forced) != n_decode:
        raise ConfigurationError(f"teacher forcing needs {n_decode} tokens, got {len(forced)}")

    def pick(step: int, logits: np.ndarray) -> int:
        return int(forced[step]) if forced is not None else int(np.argmax(logits[-1]))

    kw = dict(boundary_dtype=boundary_dtype, capture=capture, keep_boundaries=keep_boundaries, route=route)
    passes = [_prefill(stages, infos, prompt, session, epoch, all_logits=all_logits, **kw)]
    chosen = [pick(0, passes[-1].logits)]
    if isinstance(route, RingRoute) and n_decode > 1:  # the stages choose the rest (forced: refused)
        run = route.decode(
            session,
            epoch,
            len(prompt),
            chosen[0],
            n_decode - 1,
            boundary_dtype=boundary_dtype,
            keep_boundaries=keep_boundaries,
            logits=ring_logits,
        )
        if len(run.tokens) != n_decode - 1:
            raise route.stages[-1].failure(
                "BAD_REPLY", f"the ring ended ({run.end}) after {len(run.tokens)} of {n_decode - 1} tokens"
            )
        rows = 1 if ring_logits else 0
        ringed = [_delivered(route, p, 1, rows, ring=True) for p in run.passes]
        return chosen + list(run.tokens), passes + ringed
    while len(chosen) < n_decode:
        pos = len(prompt) + len(chosen) - 1
        passes.append(_forward_all(stages, infos, session, epoch, [pos], [chosen[-1]], all_logits=True, **kw))
        chosen.append(pick(len(chosen), passes[-1].logits))
    return chosen, passes


def _prefill(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    session: str,
    epoch: int,
    draft: int = 0,
    **kw,
) -> _Pass:
    """``prompt`` at positions 0.. in chunks of the smallest n_batch of the stages, seen as one pass
    (``draft``: an MTP last stage drafts after the last chunk)."""
    batch = min((i.n_batch for i in infos if i.n_batch > 0), default=len(prompt))
    chunks = []
    for first in range(0, len(prompt), batch):
        part = list(prompt[first : first + batch])
        positions = list(range(first, first + len(part)))
        last = first + batch >= len(prompt)
        chunks.append(
            _forward_all(stages, infos, session, epoch, positions, part, draft=draft if last else 0, **kw)
        )
    return _merge(chunks, all_logits=kw["all_logits"])


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
    forwarding: str = "relayed",
    addresses: Sequence[str] | None = None,
    sink_host: str = "127.0.0.1",
    forced: Sequence[Sequence[int]] | None = None,
) -> Trace:
    """Prefill then greedy-decode every prompt (one fresh session each, reset afterwards).

    ``forced`` (one continuation of n_decode tokens per prompt): teacher forcing, each decode step fed
    the given token instead of this run's argmax, so the positions see the same inputs as the run that
    chose them (a backend compared with the reference it should agree with, row by row)."""
    if forced is not None and len(forced) != len(prompts):
        raise ConfigurationError(f"teacher forcing needs one continuation per prompt ({len(prompts)})")
    infos = describe(stages)
    _check_fits(infos, max(len(p) for p in prompts) + n_decode)
    wanted = sorted(set(int(il) for il in capture))
    if any(not 0 <= il < infos[0].n_layer for il in wanted):
        raise ConfigurationError(f"capture layers {wanted} fall outside 0:{infos[0].n_layer}")
    if wanted and forwarding != "relayed":
        raise ConfigurationError(
            "layer captures need relayed forwarding (they are for the monolithic reference)"
        )
    if forced is not None and forwarding == "ring":
        raise ConfigurationError(
            "teacher forcing needs relayed or chained forwarding (a ring picks its own tokens)"
        )
    traces = []
    with _routing(stages, infos, forwarding, addresses, sink_host) as route:
        for i, prompt in enumerate(prompts):
            traces.append(
                _prompt_trace(
                    stages,
                    infos,
                    prompt,
                    n_decode,
                    tag=f"p{i}",
                    epoch=epoch,
                    boundary_dtype=boundary_dtype,
                    all_logits=all_logits,
                    capture=wanted,
                    route=route,
                    forced=None if forced is None else forced[i],
                )
            )
    return Trace(
        placement=tuple((i.layer_begin, i.layer_end) for i in infos),
        cuts=tuple(i.layer_begin for i in infos[1:]),
        boundary_dtype=boundary_dtype,
        infos=infos,
        prompts=tuple(traces),
        forwarding=forwarding,
    )


def _prompt_trace(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    n_decode: int,
    *,
    tag: str,
    epoch: int,
    boundary_dtype: str,
    all_logits: bool,
    capture: Sequence[int],
    route: ChainRoute | None,
    forced: Sequence[int] | None = None,
) -> PromptTrace:
    session = _session(tag)
    try:
        tokens, passes = _greedy(
            stages,
            infos,
            prompt,
            n_decode,
            session=session,
            epoch=epoch,
            boundary_dtype=boundary_dtype,
            all_logits=all_logits,
            capture=capture,
            route=route,
            forced=forced,
        )
    except BaseException:
        _reset_all(stages, session, quiet=True)
        raise
    _reset_all(stages, session, quiet=False)
    first = list(range(len(prompt))) if all_logits else [len(prompt) - 1]
    return PromptTrace(
        prompt=tuple(int(t) for t in prompt),
        tokens=tuple(tokens),
        logit_positions=tuple(first + [len(prompt) + j for j in range(n_decode - 1)]),
        logits=np.concatenate([p.logits for p in passes]),
        boundaries={
            info.layer_begin: np.concatenate([p.boundaries[k] for p in passes])
            for k, info in enumerate(infos[1:])
        },
        captures={il: np.concatenate([p.captures[il] for p in passes]) for il in capture},
        prefill=passes[0].step,
        decode=tuple(p.step for p in passes[1:]),
    )


def measure_speed(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    *,
    repetitions: int = 5,
    warmup: int = 1,
    boundary_dtype: str = "f32",
    forwarding: str = "relayed",
    addresses: Sequence[str] | None = None,
    sink_host: str = "127.0.0.1",
    ring_streams: bool = True,
    ring_logits: bool = True,
    ring_driver_yields: bool = True,
    ring_delivery_stream: bool = True,
) -> SpeedSamples:
    """Warm up, then time ``repetitions`` fresh sessions of prefill + (n_decode - 1) decode steps.

    Only the last logits row comes back (as in real serving), and boundaries are not kept.
    ``ring_streams=False``: a ring's passes as one Forward call per stage (the benchmark compares).
    ``ring_logits=False``: a ring delivers tokens only (what a serving client takes); no token can then
    be held to its logits row, so every repetition must choose the same tokens (BAD_REPLY if not).
    ``ring_driver_yields=False``: the driver's threads may preempt a stage while it reads a ring
    (pipeline/yielding.py; the benchmark compares).  ``ring_delivery_stream=False``: a ring's deliveries
    as Deliver calls, not frames on the driver's delivery port (pipeline/delivery_port.py; the same).
    """
    if repetitions < 1 or n_decode < 2:
        raise ConfigurationError("speed needs at least one repetition and a decode length of at least 2")
    infos = describe(stages)
    _check_fits(infos, len(prompt) + n_decode)
    runs, chosen = [], set()
    with _routing(
        stages,
        infos,
        forwarding,
        addresses,
        sink_host,
        ring_streams=ring_streams,
        ring_driver_yields=ring_driver_yields,
        ring_delivery_stream=ring_delivery_stream,
    ) as route:
        for r in range(warmup + repetitions):
            session = _session(f"speed{r}")
            try:
                tokens, passes = _greedy(
                    stages,
                    infos,
                    prompt,
                    n_decode,
                    session=session,
                    epoch=1,
                    boundary_dtype=boundary_dtype,
                    all_logits=False,
                    capture=(),
                    keep_boundaries=False,
                    route=route,
                    ring_logits=ring_logits,
                )
            finally:
                _reset_all(stages, session, quiet=True)
            chosen.add(tuple(tokens))
            if r >= warmup:
                runs.append(passes)
        delivered = route.sink.deliveries_came_as() if isinstance(route, RingRoute) else ""
    # a token-only ring's tokens were held to no logits row: the same prompt, greedy, a fresh session
    # each time, so every repetition must give one answer (other modes checked each token already)
    if forwarding == "ring" and not ring_logits and len(chosen) > 1:
        raise stages[-1].failure(
            "BAD_REPLY",
            f"{len(chosen)} different greedy continuations of one prompt "
            f"over {warmup + repetitions} repetitions",
        )
    prefill, decode, seams, compute = [], [], [], []
    for passes in runs:
        steps = [p.step for p in passes[1:]]
        prefill.append(passes[0].step.n_tokens / passes[0].step.wall_seconds)
        decode.append(len(steps) / sum(s.wall_seconds for s in steps))
        seams.append(
            tuple(float(np.median([s.seam_seconds[j] for s in steps])) for j in range(len(stages) - 1))
        )
        compute.append(
            tuple(float(np.median([s.stage_compute[k] for s in steps])) for k in range(len(stages)))
        )
    return SpeedSamples(
        n_prompt=len(prompt),
        n_decode=n_decode,
        prefill_tok_s=tuple(prefill),
        decode_tok_s=tuple(decode),
        seam_seconds=tuple(seams),
        seam_bytes_per_token=runs[-1][-1].step.seam_bytes,
        stage_compute_per_token=tuple(compute),
        forwarding=forwarding,
        crossings_per_token=runs[-1][-1].step.crossings,
        ring_deliveries=delivered,
    )


def route_change(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    switch_at: int,
    *,
    after: Sequence[StageClient] | None = None,
    boundary_dtype: str = "f32",
) -> RouteChange:
    """Decode ``switch_at`` tokens under epoch 1, switch to epoch 2 (on ``after``, default the same
    stages), re-prefill prompt + tokens so far, finish; compare with one uninterrupted session."""
    if not 1 <= switch_at < n_decode:
        raise ConfigurationError(f"switch_at must be within 1..{n_decode - 1}")
    after = list(after) if after is not None else list(stages)
    infos, infos_after = describe(stages), describe(after)
    _check_fits(infos, len(prompt) + n_decode)
    _check_fits(infos_after, len(prompt) + n_decode)
    kw = dict(boundary_dtype=boundary_dtype, all_logits=False, capture=(), keep_boundaries=False)
    ref_session, session = _session("ref"), _session("route")
    try:
        reference, _ = _greedy(stages, infos, prompt, n_decode, session=ref_session, epoch=1, **kw)
        before, _ = _greedy(stages, infos, prompt, switch_at, session=session, epoch=1, **kw)
        # The new epoch must not reuse the old KV: a request that continues it has to be refused.
        try:
            next_pos = len(prompt) + switch_at - 1
            after[0].forward(session, 2, [next_pos], tokens=[before[-1]], boundary_dtype=boundary_dtype)
            miss = "ACCEPTED"
        except StageFailed as exc:
            if exc.code == "DIED":
                raise
            miss = exc.code
        history = list(prompt) + before
        rest, _ = _greedy(after, infos_after, history, n_decode - switch_at, session=session, epoch=2, **kw)
    finally:
        for group in {id(stages): stages, id(after): after}.values():
            _reset_all(group, ref_session, quiet=True)
            _reset_all(group, session, quiet=True)
    return RouteChange(
        reference=tuple(reference),
        switched=tuple(before + rest),
        switch_at=switch_at,
        reprefill_tokens=len(history),
        cache_miss=miss,
    )


# For drivers of several sessions at once (pipeline.concurrency) ------------------------------------
def open_route(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    forwarding: str = "relayed",
    addresses: Sequence[str] | None = None,
    sink_host: str = "127.0.0.1",
) -> AbstractContextManager[ChainRoute | None]:
    """The route one driver thread decodes through (None for relayed; its own sink when chained);
    ``infos``: the stages' ``describe``, asked once by the caller for every thread."""
    return _routing(stages, infos, forwarding, addresses, sink_host)


def greedy_session(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    n_decode: int,
    *,
    session: str,
    route: ChainRoute | None,
    boundary_dtype: str = "f32",
) -> tuple[list[int], np.ndarray]:
    """One session's prefill + greedy decode as a speed run makes it (last logits row of each pass, no
    boundaries kept): the tokens chosen and those rows.  The caller resets the session."""
    tokens, passes = _greedy(
        stages,
        infos,
        prompt,
        n_decode,
        session=session,
        epoch=1,
        boundary_dtype=boundary_dtype,
        all_logits=False,
        capture=(),
        keep_boundaries=False,
        route=route,
    )
    return tokens, np.concatenate([p.logits for p in passes])


@dataclass(frozen=True, kw_only=True)
class Passed:
    """One pass as a decode loop of its own (pipeline/speculative.py) reads it."""

    logits: np.ndarray  # the last row (prefill) or every row (forward_pass)
    step: Step
    draft: tuple[int, ...] = ()  # an MTP last stage's drafts to follow the pass
    accepted: int = 0  # an MTP last stage's count of the pass's drafted tokens that stood


def prefill(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    *,
    session: str,
    epoch: int = 1,
    boundary_dtype: str = "f32",
    route: ChainRoute | None = None,
    draft: int = 0,
) -> Passed:
    """The prompt's pass (for drivers of their own decode loop, pipeline/speculative.py): the last
    logits row, the step, and with ``draft`` the MTP last stage's drafts after it."""
    if not prompt:
        raise ConfigurationError("a prompt needs at least one token")
    done = _prefill(
        stages,
        infos,
        prompt,
        session,
        epoch,
        boundary_dtype=boundary_dtype,
        all_logits=False,
        capture=(),
        keep_boundaries=False,
        route=route,
        draft=draft,
    )
    return Passed(logits=done.logits, step=done.step, draft=done.draft)


def forward_pass(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    positions: Sequence[int],
    tokens: Sequence[int],
    *,
    session: str,
    epoch: int = 1,
    boundary_dtype: str = "f32",
    route: ChainRoute | None = None,
    rewind: bool = False,
    draft: int = 0,
    drafted: int = 0,
) -> Passed:
    """One pass of ``tokens`` at ``positions`` through every stage: the logits of every row and the step.
    ``rewind``: the stages first take back the positions they hold from ``positions[0]`` on; ``drafted``
    / ``draft``: an MTP last stage verifies the pass's last tokens / drafts this many after it."""
    done = _forward_all(
        stages,
        infos,
        session,
        epoch,
        list(positions),
        list(tokens),
        boundary_dtype=boundary_dtype,
        all_logits=True,
        capture=(),
        keep_boundaries=False,
        route=route,
        rewind=rewind,
        draft=draft,
        drafted=drafted,
    )
    return Passed(logits=done.logits, step=done.step, draft=done.draft, accepted=done.accepted)


def ring_pass(route: ChainRoute, got: ChainedPass, n: int, rows: int) -> Passed:
    """One delivery of a ring (pipeline/ring.py) as a pass of ``n`` positions: its ``rows`` logits rows
    and its step (n_stages crossings: the delivery is off the critical path)."""
    done = _delivered(route, got, n, rows, ring=True)
    return Passed(logits=done.logits, step=done.step, draft=got.draft, accepted=got.accepted)


def new_session(tag: str) -> str:
    return _session(tag)


def reset_session(stages: Sequence[StageClient], session: str) -> None:
    _reset_all(stages, session, quiet=True)
