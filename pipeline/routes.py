"""The pipeline's ways of forwarding a pass, behind one interface.

A *route spec* is a frozen value naming one way of forwarding with its own options: ``Relayed``,
``Pipelined`` (relayed, its prefill's chunks overlapped across the stages), ``Chained`` or ``Ring``
(its passes streamed or unary, its deliveries with logits or tokens only).  A recipe's placement names
one (``spec_named``), a benchmark builds one with other options.  ``spec.open(stages, infos, reach)``
gives the *route* over a started placement's stages: it moves one pass (``forward``), a prompt's chunks
(``prefill``), lets the stages decode by themselves where they can (``decode``), waits for every
acknowledgement (``drain``) and says what it records about itself for the certificate (``record``).
``pipeline.drive`` and ``certify.measure`` hold routes and specs and never ask which kind they are.

Each kind also says what it costs: the one-way messages on one decode token's critical path
(``critical_path``, priced by pipeline.physics), and which of them the driver measures as seam k.

A new way of forwarding (TLS seams): a spec class here with ``open`` and ``critical_path``, a route
class with ``forward``/``prefill``/``decode``/``drain``/``record``, and its name in ``SPECS``; nothing
in drive or measure changes.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import numpy as np

from core.errors import ConfigurationError
from pipeline.pipelined import overlapped
from pipeline.ring import RingRoute, ring_route
from pipeline.sink import ChainedPass, ChainRoute, chain_route
from worker import wire
from worker.client import Forwarded, StageClient, StageInfo


@dataclass(frozen=True, kw_only=True)
class Reach:
    """How the stages reach each other (None: each client's own address) and where the driver's sink
    listens (an address the last stage can reach: in network namespaces, the driver's side of its link)."""

    addresses: tuple[str, ...] | None = None
    sink_host: str = "127.0.0.1"


LOOPBACK = Reach()


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
    # One-way network messages on the critical path of the pass (the route's critical_path).
    crossings: int = 0
    forwarding: str = "relayed"


@dataclass(kw_only=True)
class Pass:
    """One pass as the driver keeps it."""

    logits: np.ndarray
    boundaries: list[np.ndarray]
    captures: dict[int, np.ndarray]
    step: Step
    draft: tuple[int, ...] = ()  # MTP last stage: the tokens it drafted to follow the pass
    accepted: int = 0  # MTP last stage: the pass's drafted tokens that stood


@dataclass(frozen=True, kw_only=True)
class PassOptions:
    """What one pass asks of the stages beyond its positions and tokens."""

    boundary_dtype: str = "f32"
    all_logits: bool = False  # every position's logits row, else the last one
    capture: tuple[int, ...] = ()  # layers whose entering residual comes back (relayed only)
    keep_boundaries: bool = False  # every seam's boundary comes back to the driver
    rewind: bool = False  # positions[0] may take back positions the stages hold
    draft: int = 0  # an MTP last stage drafts this many after the pass
    drafted: int = 0  # an MTP last stage verifies the pass's last this many tokens


@dataclass(frozen=True, kw_only=True)
class Decoded:
    """What the stages decoded by themselves: the tokens they chose and one Pass per token."""

    tokens: tuple[int, ...]
    passes: tuple[Pass, ...]


@dataclass(frozen=True, kw_only=True)
class Hop:
    """One one-way message on a decode token's critical path."""

    what: str  # "token id", "seam k boundary", "boundary reply", "logits"
    into: int | None  # the stage it goes into, None for the driver
    seam: int | None = None  # it carries seam k's boundary (payload: that seam's bytes)
    logits: bool = False  # it carries the logits row
    tokens_with_boundary: bool = False  # the token ids ride with every boundary (chained, ring)


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One pass's worth of a prompt: its positions and token ids."""

    positions: tuple[int, ...]
    tokens: tuple[int, ...]


def chunked(prompt: Sequence[int], batch: int) -> list[Chunk]:
    """``prompt`` at positions 0.. in chunks of at most ``batch`` positions."""
    return [
        Chunk(
            positions=tuple(range(first, min(first + batch, len(prompt)))),
            tokens=tuple(prompt[first : first + batch]),
        )
        for first in range(0, len(prompt), batch)
    ]


def in_turn(
    route: Route, session: str, epoch: int, chunks: Sequence[Chunk], options: PassOptions
) -> list[Pass]:
    """Each chunk through every stage before the next starts (every route's prefill but a pipelined one)."""
    plain = replace(options, draft=0)
    return [
        route.forward(session, epoch, c.positions, c.tokens, options if k == len(chunks) - 1 else plain)
        for k, c in enumerate(chunks)
    ]


class Route(Protocol):
    """One way of forwarding, opened over a started placement's stages."""

    @property
    def spec(self) -> RouteSpec:
        """The spec this route was opened from."""
        ...

    @property
    def stages(self) -> Sequence[StageClient]:
        """The placement's stages, stage 0 first."""
        ...

    @property
    def infos(self) -> Sequence[StageInfo]:
        """Each stage's Info, in the order of ``stages``."""
        ...

    def forward(
        self, session: str, epoch: int, positions: Sequence[int], tokens: Sequence[int], options: PassOptions
    ) -> Pass:
        """One pass of ``tokens`` at ``positions`` through every stage."""
        ...

    def prefill(self, session: str, epoch: int, chunks: Sequence[Chunk], options: PassOptions) -> list[Pass]:
        """A prompt's chunks (each at most the stages' batch), one Pass each, in order; ``options.draft``
        applies to the last chunk only.  Each stage computes the chunks in order; a route may overlap
        them across stages."""
        ...

    def decode(
        self, session: str, epoch: int, position: int, token: int, budget: int, options: PassOptions
    ) -> Decoded | None:
        """The stages' own greedy decode of ``budget`` tokens after ``token`` (fed at ``position``),
        one Pass per token; None where the driver decodes pass by pass."""
        ...

    @property
    def ring(self) -> RingRoute | None:
        """The ring the stages decode on, for drivers of their own ring (speculative drafting)."""
        ...

    def drain(self, *, quiet: bool = False) -> None:
        """Every outstanding acknowledgement in; the first failure raised unless ``quiet``."""
        ...

    def record(self) -> dict[str, str]:
        """How this placement's passes travel, for its record in the certificate."""
        ...

    def observed(self) -> dict[str, str]:
        """What the route saw of its own traffic while it ran, for the speed record."""
        ...


class RouteSpec(Protocol):
    name: ClassVar[str]
    captures: ClassVar[bool]  # layer captures come back (the monolithic reference's)
    picks_tokens: ClassVar[bool]  # the stages choose the tokens (no teacher forcing)
    relays: ClassVar[bool]  # every boundary comes back through the driver

    @property
    def checks_tokens(self) -> bool:
        """Every token the route yields is held to its logits row."""
        ...

    def open(
        self, stages: Sequence[StageClient], infos: Sequence[StageInfo], reach: Reach = LOOPBACK
    ) -> AbstractContextManager[Route]: ...

    def driver_fed(self) -> RouteSpec:
        """The spec whose passes the driver feeds, over the same stages (itself where it is one):
        teacher forcing and drafts the driver knows need the driver to choose what goes in."""
        ...

    def critical_path(self, n_stages: int) -> list[Hop]:
        """The one-way messages on one decode token's critical path, in order."""
        ...

    def seam_hops(self, k: int) -> tuple[int, ...]:
        """The indices into critical_path of what the driver measures as seam k."""
        ...


# Relayed ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Relayed:
    """The driver relays every seam itself: stage k's boundary comes back to the driver and goes, byte
    for byte as the worker sent it, into stage k+1's request (two crossings per stage and pass)."""

    name: ClassVar[str] = "relayed"
    captures: ClassVar[bool] = True
    picks_tokens: ClassVar[bool] = False
    relays: ClassVar[bool] = True

    @contextmanager
    def open(
        self, stages: Sequence[StageClient], infos: Sequence[StageInfo], reach: Reach = LOOPBACK
    ) -> Generator[Route]:
        yield RelayedRoute(self, stages, infos)

    @property
    def checks_tokens(self) -> bool:
        return True

    def driver_fed(self) -> RouteSpec:
        return self

    def critical_path(self, n_stages: int) -> list[Hop]:
        hops = [Hop(what="token id", into=0)]
        for k in range(n_stages):
            if k:
                hops.append(Hop(what=f"seam {k - 1} boundary", into=k, seam=k - 1))
            last = k == n_stages - 1
            hops.append(
                Hop(
                    what="logits" if last else "boundary reply",
                    into=None,
                    seam=None if last else k,
                    logits=last,
                )
            )
        return hops

    def seam_hops(self, k: int) -> tuple[int, ...]:
        """What the driver measures as seam k: stage k+1's round trip minus its compute, i.e. the
        boundary into stage k+1 plus that stage's reply into the driver."""
        return (2 * (k + 1), 2 * (k + 1) + 1)


class RelayedRoute:
    ring = None

    def __init__(self, spec: Relayed, stages: Sequence[StageClient], infos: Sequence[StageInfo]) -> None:
        self.spec, self.stages, self.infos = spec, list(stages), list(infos)

    def forward(
        self, session: str, epoch: int, positions: Sequence[int], tokens: Sequence[int], options: PassOptions
    ) -> Pass:
        replies: list[Forwarded] = []
        started = time.perf_counter()
        relay: wire.Tensor | None = None
        for k, (stage, info) in enumerate(zip(self.stages, self.infos, strict=True)):
            reply = self._one_stage(k, stage, info, session, epoch, positions, tokens, relay, options)
            relay = reply.boundary_wire
            replies.append(reply)
        return self.relayed_pass(replies, len(positions), time.perf_counter() - started, options)

    def relayed_pass(
        self, replies: Sequence[Forwarded], n_tokens: int, wall_seconds: float, options: PassOptions
    ) -> Pass:
        """One pass of ``n_tokens`` positions from its stages' replies, stage 0 first (every non-last
        stage's boundary kept where the options ask: ``_one_stage`` held each to its shape)."""
        captures: dict[int, np.ndarray] = {}
        for reply in replies:
            captures.update(reply.captures)
        boundaries = (
            [r.boundary for r in replies[:-1] if r.boundary is not None] if options.keep_boundaries else []
        )
        step = Step(
            n_tokens=n_tokens,
            wall_seconds=wall_seconds,
            stage_wall=tuple(r.wall_seconds for r in replies),
            stage_compute=tuple(r.compute_seconds for r in replies),
            seam_bytes=tuple(r.boundary_bytes for r in replies[:-1]),
            seam_seconds=tuple(max(0.0, r.wall_seconds - r.compute_seconds) for r in replies[1:]),
            crossings=2 * len(replies),
            forwarding=self.spec.name,
        )
        assert replies[-1].logits is not None
        return Pass(
            logits=replies[-1].logits,
            boundaries=boundaries,
            captures=captures,
            step=step,
            draft=replies[-1].draft,
            accepted=replies[-1].accepted,
        )

    @staticmethod
    def _one_stage(
        k: int,
        stage: StageClient,
        info: StageInfo,
        session: str,
        epoch: int,
        positions: Sequence[int],
        tokens: Sequence[int],
        relay: wire.Tensor | None,
        options: PassOptions,
    ) -> Forwarded:
        """Stage k's Forward, its reply's shapes checked (captures, logits or boundary)."""
        n = len(positions)
        mine = [il for il in options.capture if info.layer_begin <= il < info.layer_end]
        last = info.last_stage
        reply = stage.forward(
            session,
            epoch,
            list(positions),
            tokens=list(tokens) if (k == 0 or info.needs_token_sideband or info.mtp) else (),
            boundary=relay,
            boundary_dtype=options.boundary_dtype,
            all_logits=options.all_logits,
            capture_layers=mine,
            rewind=options.rewind,
            draft=options.draft if last else 0,
            drafted=options.drafted if last else 0,
        )
        if sorted(reply.captures) != sorted(mine):
            raise stage.failure("BAD_REPLY", f"asked to capture layers {mine}, got {sorted(reply.captures)}")
        for il, arr in reply.captures.items():
            # A capture is n_embd wide (DeepSeek-V4: the mean of its hc residual copies); a boundary
            # may be wider (hc_mult * n_embd), so the two compare directly only on dense models.
            expect_shape(stage, f"capture of layer {il}", arr, (n, info.n_embd))
        if last:
            expect_shape(stage, "logits", reply.logits, (n if options.all_logits else 1, info.n_vocab))
        else:
            expect_shape(stage, "boundary", reply.boundary, (n, info.boundary_width))
        return reply

    def prefill(self, session: str, epoch: int, chunks: Sequence[Chunk], options: PassOptions) -> list[Pass]:
        return in_turn(self, session, epoch, chunks, options)

    def decode(
        self, session: str, epoch: int, position: int, token: int, budget: int, options: PassOptions
    ) -> Decoded | None:
        return None

    def drain(self, *, quiet: bool = False) -> None:
        return None

    def record(self) -> dict[str, str]:
        return {"forwarding": self.spec.name}

    def observed(self) -> dict[str, str]:
        return {}


# Pipelined ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pipelined(Relayed):
    """Relayed, with the prefill pipelined (pipeline/pipelined.py): the driver keeps one thread per
    stage and hands chunk i's boundary to stage k+1 while stage k computes chunk i+1, so a prompt of
    many chunks takes about the slowest stage's time instead of the sum of all of them.  Each stage
    gets its chunks in order and the same requests as relayed, so the logits are relayed's bit for bit;
    a decode token (one position) has nothing to overlap and travels as relayed."""

    name: ClassVar[str] = "pipelined"

    @contextmanager
    def open(
        self, stages: Sequence[StageClient], infos: Sequence[StageInfo], reach: Reach = LOOPBACK
    ) -> Generator[Route]:
        yield PipelinedRoute(self, stages, infos)


class PipelinedRoute(RelayedRoute):
    def prefill(self, session: str, epoch: int, chunks: Sequence[Chunk], options: PassOptions) -> list[Pass]:
        if len(chunks) < 2 or len(self.stages) < 2:
            return in_turn(self, session, epoch, chunks, options)
        plain, last = replace(options, draft=0), len(chunks) - 1

        def step(k: int, i: int, before: Forwarded | None) -> Forwarded:
            c = chunks[i]
            relay = before.boundary_wire if before is not None else None
            opts = options if i == last else plain
            return self._one_stage(
                k, self.stages[k], self.infos[k], session, epoch, c.positions, c.tokens, relay, opts
            )

        started = time.perf_counter()
        done = overlapped(len(self.stages), len(chunks), step)
        # each chunk's wall time runs from the one before it leaving the last stage, so the chunks'
        # times add up to the prefill's (what drive's merged pass and the speed figures read)
        begins = [started, *done.finished[:-1]]
        return [
            self.relayed_pass(_complete(replies), len(c.positions), end - begin, options)
            for replies, c, begin, end in zip(done.replies, chunks, begins, done.finished, strict=True)
        ]


def _complete(replies: Sequence[Forwarded | None]) -> list[Forwarded]:
    """A chunk's replies once the schedule returned without error: every stage answered it."""
    out = [r for r in replies if r is not None]
    assert len(out) == len(replies)
    return out


# Chained ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chained:
    """The driver sends one request to stage 0 with the addresses of the stages after it and of its
    sink (pipeline/sink.py); each stage forwards its boundary straight to the next and the last stage
    delivers the logits to the sink: n_stages + 1 crossings per pass.  Timings come from the stages'
    hop records (meaningful when every stage runs on this machine, network namespaces included)."""

    name: ClassVar[str] = "chained"
    captures: ClassVar[bool] = False
    picks_tokens: ClassVar[bool] = False
    relays: ClassVar[bool] = False

    @contextmanager
    def open(
        self, stages: Sequence[StageClient], infos: Sequence[StageInfo], reach: Reach = LOOPBACK
    ) -> Generator[Route]:
        with chain_route(stages, infos, addresses=reach.addresses, sink_host=reach.sink_host) as chain:
            yield ChainedRoute(self, chain)

    @property
    def checks_tokens(self) -> bool:
        return True

    def driver_fed(self) -> RouteSpec:
        return self

    def critical_path(self, n_stages: int) -> list[Hop]:
        return [*_stage_hops(n_stages), Hop(what="logits", into=None, logits=True)]

    def seam_hops(self, k: int) -> tuple[int, ...]:
        """Seam k as measured: the boundary's one crossing into stage k+1 (between the workers' clocks)."""
        return (1 + k,)


def _stage_hops(n_stages: int) -> list[Hop]:
    """The token into stage 0, then each seam's boundary (with the token ids) into the next stage."""
    return [Hop(what="token id", into=0)] + [
        Hop(what=f"seam {k} boundary", into=k + 1, seam=k, tokens_with_boundary=True)
        for k in range(n_stages - 1)
    ]


class ChainedRoute:
    ring: RingRoute | None = None

    def __init__(self, spec: RouteSpec, chain: ChainRoute) -> None:
        self.spec, self.chain = spec, chain
        self.stages, self.infos = chain.stages, chain.infos

    def forward(
        self, session: str, epoch: int, positions: Sequence[int], tokens: Sequence[int], options: PassOptions
    ) -> Pass:
        got = self.chain.run(
            session,
            epoch,
            positions,
            tokens,
            boundary_dtype=options.boundary_dtype,
            all_logits=options.all_logits,
            keep_boundaries=options.keep_boundaries,
            rewind=options.rewind,
            draft=options.draft,
            drafted=options.drafted,
        )
        n = len(positions)
        # a ring's prefill is a chained pass too: n_stages + 1 crossings, the delivery included
        done = delivered(
            self.chain,
            got,
            n,
            n if options.all_logits else 1,
            crossings=len(got.hops) + 1,
            forwarding=Chained.name,
        )
        done.draft, done.accepted = got.draft, got.accepted
        return done

    def prefill(self, session: str, epoch: int, chunks: Sequence[Chunk], options: PassOptions) -> list[Pass]:
        return in_turn(self, session, epoch, chunks, options)

    def decode(
        self, session: str, epoch: int, position: int, token: int, budget: int, options: PassOptions
    ) -> Decoded | None:
        return None

    def drain(self, *, quiet: bool = False) -> None:
        self.chain.drain(quiet=quiet)

    def record(self) -> dict[str, str]:
        return {"forwarding": self.spec.name}

    def observed(self) -> dict[str, str]:
        return {}


def delivered(
    chain: ChainRoute, got: ChainedPass, n: int, rows: int, *, crossings: int, forwarding: str
) -> Pass:
    """A chained pass (or one token of a ring) as a Pass, its shapes checked."""
    # Everything arrives in the last stage's delivery, so a bad shape is reported against that stage.
    last = chain.stages[-1]
    logits = expect_shape(last, "logits", got.logits, (rows, chain.infos[-1].n_vocab))
    width = chain.infos[0].boundary_width
    boundaries = [
        expect_shape(last, f"boundary of stage {k}", b, (n, width)) for k, b in enumerate(got.boundaries)
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
        crossings=crossings,
        forwarding=forwarding,
    )
    return Pass(logits=logits, boundaries=boundaries, captures={}, step=step)


# Ring ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ring:
    """Greedy decode on the stages themselves (pipeline/ring.py): the prefill as ``Chained``, then the
    last stage picks each token and starts the next pass at stage 0 (n_stages crossings per token);
    the driver reads tokens and logits from its sink and holds each token to its logits row.

    ``streams``: passes as messages on each next stage's pass port where every stage offers one (else
    one Forward call per stage).  ``logits``: deliveries carry the logits row (False: tokens only, what
    a serving client takes).  ``driver_yields``: the driver's threads never preempt a stage while it
    reads (pipeline/yielding.py).  ``delivery_stream``: deliveries as frames on the driver's delivery
    port (pipeline/delivery_port.py), not Deliver calls.  The defaults are what certification runs;
    the benchmarks turn each off to compare."""

    name: ClassVar[str] = "ring"
    captures: ClassVar[bool] = False
    picks_tokens: ClassVar[bool] = True
    relays: ClassVar[bool] = False
    streams: bool = True
    logits: bool = True
    driver_yields: bool = True
    delivery_stream: bool = True

    @contextmanager
    def open(
        self, stages: Sequence[StageClient], infos: Sequence[StageInfo], reach: Reach = LOOPBACK
    ) -> Generator[Route]:
        with ring_route(
            stages,
            infos,
            addresses=reach.addresses,
            sink_host=reach.sink_host,
            streams=self.streams,
            driver_yields=self.driver_yields,
            delivery_stream=self.delivery_stream,
        ) as ring:
            yield RingedRoute(self, ring)

    @property
    def checks_tokens(self) -> bool:
        """Only with its logits rows: a token-only ring's tokens are taken as delivered."""
        return self.logits

    def driver_fed(self) -> RouteSpec:
        """A ring's last stage picks the tokens, so what the driver feeds goes through the stages chained."""
        return Chained()

    def critical_path(self, n_stages: int) -> list[Hop]:
        """As chained, less the delivery: the last stage hands its token straight to stage 0, and its
        delivery to the driver is off the critical path."""
        return _stage_hops(n_stages)

    def seam_hops(self, k: int) -> tuple[int, ...]:
        return (1 + k,)


class RingedRoute(ChainedRoute):
    def __init__(self, spec: Ring, ring: RingRoute) -> None:
        super().__init__(spec, ring)
        self.ring_spec, self.ring = spec, ring

    def decode(
        self, session: str, epoch: int, position: int, token: int, budget: int, options: PassOptions
    ) -> Decoded | None:
        assert self.ring is not None
        run = self.ring.decode(
            session,
            epoch,
            position,
            token,
            budget,
            boundary_dtype=options.boundary_dtype,
            keep_boundaries=options.keep_boundaries,
            logits=self.ring_spec.logits,
        )
        if len(run.tokens) != budget:
            raise self.stages[-1].failure(
                "BAD_REPLY", f"the ring ended ({run.end}) after {len(run.tokens)} of {budget} tokens"
            )
        rows = 1 if self.ring_spec.logits else 0
        return Decoded(tokens=run.tokens, passes=tuple(ring_pass(self.ring, p, 1, rows) for p in run.passes))

    def record(self) -> dict[str, str]:
        assert self.ring is not None
        return {
            "forwarding": self.spec.name,
            "ring_transport": "tcp pass port" if self.ring.streamed else "grpc forward",
        }

    def observed(self) -> dict[str, str]:
        assert self.ring is not None
        came_as = self.ring.sink.deliveries_came_as()
        return {"ring_deliveries": came_as} if came_as else {}


def ring_pass(ring: RingRoute, got: ChainedPass, n: int, rows: int) -> Pass:
    """One delivery of a ring as a pass of ``n`` positions: its ``rows`` logits rows and its step
    (n_stages crossings: the delivery is off the critical path)."""
    done = delivered(ring, got, n, rows, crossings=len(got.hops), forwarding=Ring.name)
    done.draft, done.accepted = got.draft, got.accepted
    return done


# Names --------------------------------------------------------------------------------------------
SPECS: dict[str, RouteSpec] = {
    "relayed": Relayed(),
    "pipelined": Pipelined(),
    "chained": Chained(),
    "ring": Ring(),
}
RELAYED = SPECS["relayed"]


def recorded(name: object) -> RouteSpec:
    """The spec a certificate's ``forwarding`` names (older or foreign names read as relayed: their
    seams were measured through the driver)."""
    return SPECS.get(name, RELAYED) if isinstance(name, str) else RELAYED


def spec_named(name: str) -> RouteSpec:
    """The default spec of a way of forwarding, by the name a recipe gives it."""
    try:
        return SPECS[name]
    except KeyError:
        raise ConfigurationError(f"forwarding {name!r} is not one of {', '.join(SPECS)}") from None


def expect_shape(stage: StageClient, what: str, arr: np.ndarray | None, shape: tuple[int, int]) -> np.ndarray:
    """``arr`` when it has the shape the pass needs, else BAD_REPLY against the stage it came from."""
    if arr is None or arr.shape != shape:
        got = None if arr is None else list(arr.shape)
        raise stage.failure("BAD_REPLY", f"{what} {got}, expected {list(shape)}")
    return arr
