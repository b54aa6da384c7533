"""Ring decode for greedy runs, the driver's side: the stages decode on their own, the driver reads.

After the prefill the driver sends one chained pass carrying a ``Ring`` (token budget, stop tokens,
every stage's address).  The last stage picks the greedy token itself (numpy's argmax rule), delivers
logits + token to the driver's sink and starts the next pass at stage 0 from its own thread, until
the budget is spent, a stop token is chosen or the context is full (worker/README.md, "Ring decode").
No driver call sits between two tokens; the driver consumes the deliveries as a stream and checks
each one: its index is the next, its token is ``np.argmax`` of its own logits, its hops are the
placement's.

With ``draft=k`` (a last stage started with ``--mtp``) the ring is speculative: each pass feeds the
last chosen token and the nextn block's drafts, and the last stage chooses the accepted drafts and the
bonus token, drafts again and starts the next pass (pipeline/ring_drafts.py checks each delivery).

A failed pass reaches the sink as a RING_FAILED delivery naming the stage.  A stage that dies where
no one is left to say so (the last stage itself) is found by the driver: while no token arrives it
checks every worker it launched for an exit (each POLL_SECONDS) and, after SILENCE_SECONDS, asks
every stage for Health; a stage that has died or does not answer is named.  Silence beyond the
stages' call deadline with every stage healthy is DEADLINE_EXCEEDED.

    with ring_route(stages, infos, addresses=None, sink_host="127.0.0.1") as route:
        got = generate(route, prompt, budget=32, stop_tokens=(2,))   # Generated: tokens, logits, end
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

import grpc
import numpy as np

from core.errors import ConfigurationError
from pipeline.delivery_port import DeliveryPort
from pipeline.ring_drafts import DraftedPass, DraftedPasses
from pipeline.sink import ChainedPass, ChainRoute, Received, Sink
from pipeline.yielding import yielding_to_stages
from worker import wire
from worker.client import ChainAck, StageClient, StageFailed, StageInfo, ended_stage
from worker.tls import Identity

POLL_SECONDS = 0.1  # how often a silent ring's workers are checked for an exit
SILENCE_SECONDS = 0.5  # no token for this long: every stage is asked for Health (a slow one costs nothing)
HEALTH_DEADLINE = 1.0  # generous: a loaded machine must not make a healthy stage look hung

# RingEnd in shard.proto, by value
ENDS = {0: "continues", 1: "budget", 2: "stop_token", 3: "context_full", 4: "failed"}


class RingSink(Sink):
    """A sink that also takes ring deliveries: each open ring's go, in arrival order, to its own queue.

    A ring delivery for a ring nobody reads (unknown, or closed: the driver has its answer or gave
    up) is refused with FAILED_PRECONDITION, which stops that ring at its last stage."""

    def __init__(
        self,
        pb2: ModuleType,
        pb2_grpc: ModuleType,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int = 4,
        tls: Identity | None = None,
    ) -> None:
        super().__init__(pb2, pb2_grpc, host=host, port=port, threads=threads, tls=tls)
        self._rings: dict[str, queue.SimpleQueue[Received]] = {}
        self._delivery_port: DeliveryPort | None = None
        self.stream_address = ""  # the delivery port (pipeline/delivery_port.py), once started
        self.ring_deliveries = 0  # ring deliveries that arrived, either way, taken or refused

    def start(self) -> str:
        """The gRPC sink, and beside it on the same host the delivery port rings may stream to."""
        address = super().start()
        if self._delivery_port is None:
            port = DeliveryPort(self._pb2, self._take_ring, host=self._host, tls=self._tls)
            try:
                self.stream_address = port.start()
            except ConfigurationError:
                super().stop()
                raise
            self._delivery_port = port
        return address

    @property
    def frames(self) -> int:
        """Ring deliveries that came as frames on the delivery port (the rest were Deliver calls)."""
        return self._delivery_port.frames if self._delivery_port is not None else 0

    def deliveries_came_as(self) -> str:
        """How this sink's ring deliveries reached it so far, for a record of what was measured:
        "frames" (the delivery port), "Deliver calls" (workers that predate it, or rings that did not
        name it), both, or "" when none came."""
        framed, came = self.frames, self.ring_deliveries
        if not came:
            return ""
        return "Deliver calls" if not framed else "frames" if framed >= came else "frames and Deliver calls"

    def stop(self, grace: float = 1.0) -> None:
        port, self._delivery_port = self._delivery_port, None
        if port is not None:
            port.stop()
        super().stop(grace)

    def open_ring(self, request_id: str) -> queue.SimpleQueue[Received]:
        got: queue.SimpleQueue[Received] = queue.SimpleQueue()
        with self._lock:
            if request_id in self._rings:
                raise ValueError(f"ring {request_id!r} is already open")
            self._rings[request_id] = got
        return got

    def close_ring(self, request_id: str) -> None:
        with self._lock:
            self._rings.pop(request_id, None)

    def _deliver(self, request: wire.Delivery, context: grpc.ServicerContext) -> object:
        received_at = time.perf_counter()
        if not request.HasField("ring"):
            with self._lock:
                ring_open = request.request_id in self._rings
            if ring_open:  # refused: the first pass's ack carries this back to the driver
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"ring {request.request_id!r} came back as a plain chained pass: a stage "
                    f"predates ring decode (update every worker)",
                )
            return super()._deliver(request, context)
        refused = self._take_ring(request, received_at)
        if refused is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused)
        return self._pb2.DeliveryAck()

    def _take_ring(self, delivery: wire.Delivery, received_at: float) -> str | None:
        """Queue a ring delivery for its reader: None, or why it is refused (a Deliver call's or the
        delivery port's)."""
        if not delivery.HasField("ring"):
            return f"{delivery.request_id!r} is not a ring delivery (a delivery port takes rings only)"
        with self._lock:
            got = self._rings.get(delivery.request_id)
            self.ring_deliveries += 1
            self.refused += got is None
            self.delivered += got is not None
        if got is None:
            return f"no ring {delivery.request_id!r} is read by this driver"
        got.put(Received(delivery=delivery, received_at=received_at))
        return None


def _check_decode(budget: int, draft: int, drafts: Sequence[int], logits: bool) -> None:
    if budget < 1:
        raise ConfigurationError("a ring needs a budget of at least one token")
    if draft and not logits:
        raise ConfigurationError("a drafting ring needs its logits rows: its drafts are checked on them")
    if len(drafts) > draft:
        raise ConfigurationError(f"{len(drafts)} drafts for the first pass of a ring that drafts {draft}")


@dataclass(frozen=True, kw_only=True)
class RingRun:
    """What a ring brought back: the tokens it chose, in order, and one entry per pass (a one-token
    ring: one per token)."""

    tokens: tuple[int, ...]
    passes: tuple[ChainedPass, ...]  # wall_seconds: since the previous delivery (the first: the start)
    end: str  # budget, stop_token or context_full
    drafted: tuple[DraftedPass, ...] = ()  # a drafting ring: what each pass was fed and chose


@dataclass(frozen=True, kw_only=True)
class Generated:
    """A prompt's greedy continuation: the driver's pick after the prefill, then the ring's."""

    tokens: tuple[int, ...]
    logits: np.ndarray  # [len(tokens), n_vocab]: row i is the logits token i was chosen from
    end: str  # budget, stop_token or context_full
    ring: RingRun | None  # None when the first token already ended the run


class RingRoute(ChainRoute):
    """A ChainRoute (chained prefill passes) whose sink also reads rings.

    ``streamed``: the ring's passes go stage to stage as messages on a TCP connection kept open to
    each next stage's pass port (set when every stage names one); else each pass is one Forward call
    per stage (older workers).  ``driver_yields``: while it reads a ring, the driver's threads never
    preempt a stage (pipeline/yielding.py).  ``stream_deliveries``: the last stage sends the ring's
    deliveries to the sink's delivery port (pipeline/delivery_port.py) instead of a Deliver call each
    (a worker that predates Ring.delivery_stream makes the calls all the same)."""

    sink: RingSink
    streamed: bool = False
    driver_yields: bool = True
    stream_deliveries: bool = True

    def decode(
        self,
        session: str,
        epoch: int,
        position: int,
        token: int,
        budget: int,
        *,
        stop_tokens: Sequence[int] = (),
        boundary_dtype: str = "f32",
        all_logits: bool = True,
        keep_boundaries: bool = False,
        draft: int = 0,
        drafts: Sequence[int] = (),
        logits: bool = True,
    ) -> RingRun:
        """Feed ``token`` at ``position`` and let the stages choose up to ``budget`` tokens after it.
        ``draft``: a speculative ring, each pass verifying up to that many nextn drafts; ``drafts``
        (what the last stage drafted after ``token``) go into the first pass.  ``logits=False``: the
        deliveries carry tokens only (each pass's logits are then [0, n_vocab]) and no token can be
        checked against its row; not for drafting rings, whose check reads the rows."""
        _check_decode(budget, draft, drafts, logits)
        request_id = uuid.uuid4().hex
        fed = [int(token), *(int(t) for t in drafts)]
        checker = DraftedPasses(self.stages[-1], token, drafts, draft) if draft else None
        deliveries = self.sink.open_ring(request_id)
        started = time.perf_counter()
        try:
            ack = self.stages[0].forward_chained(
                session,
                epoch,
                range(position, position + len(fed)),
                tokens=fed,
                downstream=self.addresses[1:],
                deliver_to=self.sink.address,
                request_id=request_id,
                boundary_dtype=boundary_dtype,
                all_logits=all_logits,
                keep_boundaries=keep_boundaries,
                ring=self._ring_message(budget, stop_tokens, draft, logits),
                draft=draft,
                drafted=len(drafts),
            )
            self._acks.append(ack)  # collected by drain(), like a chained pass's
            with yielding_to_stages(self.driver_yields):  # the ring is on its way: the driver only reads
                return self._read(deliveries, ack, budget, started, keep_boundaries, checker, logits)
        finally:
            self.sink.close_ring(request_id)

    def _ring_message(self, budget: int, stop_tokens: Sequence[int], draft: int, logits: bool) -> wire.Ring:
        """The Ring a ring's first pass carries: its budget and stops, the stages' addresses, how its
        passes and deliveries travel."""
        first = self.stages[0]
        return first.pb2.Ring(
            budget=budget,
            stop_tokens=[int(t) for t in stop_tokens],
            stages=self.addresses,
            max_position=min(i.n_ctx for i in self.infos) - 1,
            pass_timeout_ms=int(first.deadline * 1000),
            draft=draft,
            stream=self.streamed,
            tokens_only=not logits,
            delivery_stream=self.sink.stream_address if self.stream_deliveries else "",
        )

    def _read(
        self,
        deliveries: queue.SimpleQueue[Received],
        ack: ChainAck,
        budget: int,
        started: float,
        keep_boundaries: bool,
        checker: DraftedPasses | None,
        logits: bool,
    ) -> RingRun:
        tokens: list[int] = []
        passes: list[ChainedPass] = []
        drafted: list[DraftedPass] = []
        last_at = probed_at = started
        last = self.stages[-1]
        while True:
            try:
                got = deliveries.get(timeout=POLL_SECONDS)
            except queue.Empty:
                now = time.perf_counter()
                if now - max(last_at, probed_at) >= SILENCE_SECONDS:
                    self._probe(now - last_at)
                    probed_at = time.perf_counter()
                self._check_silence(ack, time.perf_counter() - last_at)
                continue
            r = got.delivery.ring
            end = ENDS.get(int(r.end))
            if end == "failed":
                raise self._failed(r)
            if int(r.index) != len(tokens) or end is None:
                raise last.failure(
                    "BAD_REPLY",
                    f"the ring delivered token {r.index} (end {r.end}) where token {len(tokens)} was next",
                )
            passed = self._check(got, last_at, keep_boundaries=keep_boundaries, logits=logits)
            if checker is None:
                tokens.append(self._one_token(r, passed))
            else:
                drafted.append(checker.take(r, passed, end))
                tokens += drafted[-1].chosen
            passes.append(passed)
            last_at = got.received_at
            if len(tokens) > budget or (end == "continues" and len(tokens) >= budget):
                raise last.failure("BAD_REPLY", f"the ring went on past its budget of {budget} tokens")
            if end != "continues":
                return RingRun(tokens=tuple(tokens), passes=tuple(passes), end=end, drafted=tuple(drafted))

    def _one_token(self, r: wire.RingToken, passed: ChainedPass) -> int:
        """A one-token ring's pick, held to the argmax of the logits delivered with it (a token-only
        ring's is taken as delivered: its caller checks the tokens another way)."""
        if not len(passed.logits):
            return int(r.token)
        pick = int(np.argmax(passed.logits[-1]))
        if pick != int(r.token):
            raise self.stages[-1].failure(
                "BAD_REPLY",
                f"the ring chose token {r.token} at its step "
                f"{r.index}, but the argmax of the logits it delivered is {pick}",
            )
        return pick

    def _check_silence(self, ack: ChainAck, quiet: float) -> None:
        """Raise when the silence has an explanation: the first pass failed, a worker ended, or it
        lasted past the stages' deadline."""
        if ack.done():
            self._raise_if_failed(ack)
        dead = ended_stage(self.stages, None, settle=False)
        if dead is not None:
            raise dead.explain("ring decode", None, f"no token for {quiet:.2f} s", settle=False)
        if quiet > self.stages[0].deadline:
            raise self.stages[0].failure(
                "DEADLINE_EXCEEDED",
                f"the ring delivered no token for {quiet:.1f} s though every stage answers Health",
            )

    def _probe(self, quiet: float) -> None:
        for stage in self.stages:
            try:
                stage.health(deadline=HEALTH_DEADLINE)
            except StageFailed as exc:
                raise stage.failure(
                    exc.code, f"the ring delivered no token for {quiet:.2f} s and Health failed: {exc.detail}"
                ) from None

    def _failed(self, r: wire.RingToken) -> StageFailed:
        """The StageFailed of a RING_FAILED delivery: a worker that died explains it best, else the
        stage the delivery names, with the failed call's status."""
        code = grpc.StatusCode.__members__.get(r.code)
        dead = ended_stage(self.stages, code)
        if dead is not None:
            return dead.explain("ring Forward", code, r.detail, settle=False)
        k = int(r.failed_stage) if 0 <= int(r.failed_stage) < len(self.stages) else 0
        return self.stages[k].explain("ring Forward", code, r.detail, settle=False)


def generate(
    route: RingRoute,
    prompt: Sequence[int],
    budget: int,
    *,
    stop_tokens: Sequence[int] = (),
    session: str | None = None,
    epoch: int = 1,
    boundary_dtype: str = "f32",
    draft: int = 0,
    logits: bool = True,
) -> Generated:
    """Prefill ``prompt`` (chained passes of at most the smallest n_batch), pick the first token here,
    then let the ring choose the rest: at most ``budget`` tokens in all, ending early at a stop token
    (which is returned) or when the context is full.  ``draft``: a speculative ring (the prefill asks
    the last stage for the first pass's drafts).  ``logits=False``: the ring delivers tokens only, and
    ``Generated.logits`` holds the prefill's row alone.  The session is the caller's to reset."""
    if not prompt or budget < 1:
        raise ConfigurationError("a ring run needs a prompt and a budget of at least one token")
    session = session or f"dgr-ring-{uuid.uuid4().hex[:12]}"
    passed = _prefill(route, prompt, session, epoch, boundary_dtype, draft)
    first = int(np.argmax(passed.logits[-1]))
    rows = [passed.logits[-1:]]
    full = len(prompt) > min(i.n_ctx for i in route.infos) - 1
    if first in stop_tokens or budget == 1 or full:
        end = "stop_token" if first in stop_tokens else "budget" if budget == 1 else "context_full"
        return Generated(tokens=(first,), logits=rows[0], end=end, ring=None)
    room = min(budget - 2, min(i.n_ctx for i in route.infos) - 1 - len(prompt))
    run = route.decode(
        session,
        epoch,
        len(prompt),
        first,
        budget - 1,
        stop_tokens=stop_tokens,
        boundary_dtype=boundary_dtype,
        draft=draft,
        drafts=passed.draft[: max(0, room)],
        logits=logits,
    )
    route.drain()
    rows += [p.logits if draft else p.logits[-1:] for p in run.passes]
    return Generated(tokens=(first, *run.tokens), logits=np.concatenate(rows), end=run.end, ring=run)


def _prefill(
    route: RingRoute, prompt: Sequence[int], session: str, epoch: int, boundary_dtype: str, draft: int
) -> ChainedPass:
    """The prompt as chained passes of at most the smallest n_batch; the last one's delivery (with the
    first pass's drafts where ``draft`` asks for them)."""
    batch = min((i.n_batch for i in route.infos if i.n_batch > 0), default=len(prompt))
    passed = None
    for begin in range(0, len(prompt), batch):
        part = [int(t) for t in prompt[begin : begin + batch]]
        last = begin + batch >= len(prompt)
        passed = route.run(
            session,
            epoch,
            list(range(begin, begin + len(part))),
            part,
            boundary_dtype=boundary_dtype,
            all_logits=False,
            keep_boundaries=False,
            draft=draft if last else 0,
        )
    assert passed is not None  # a prompt has at least one token
    return passed


def offers_pass_ports(infos: Sequence[StageInfo]) -> bool:
    """Whether a ring over these stages is streamed: every stage names a pass port (Ring.stream)."""
    return all(i.pass_port > 0 for i in infos)


@contextmanager
def ring_route(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    *,
    addresses: Sequence[str] | None,
    sink_host: str,
    streams: bool = True,
    driver_yields: bool = True,
    delivery_stream: bool = True,
) -> Generator[RingRoute]:
    """A ring sink on ``sink_host`` and a route over ``stages``; outstanding acks are awaited on exit.
    ``streams=False``: one Forward call per pass and stage even where every stage offers streams;
    ``driver_yields=False``: the driver's threads keep their policy while it reads, and
    ``delivery_stream=False``: every delivery is a Deliver call (the benchmarks' side by side)."""
    first = stages[0]
    with RingSink(first.pb2, first.pb2_grpc, host=sink_host, tls=first.tls) as sink:
        where = addresses if addresses is not None else [s.address for s in stages]
        route = RingRoute(stages, infos, sink, where)
        route.streamed = streams and offers_pass_ports(infos)
        route.driver_yields = driver_yields
        route.stream_deliveries = delivery_stream
        try:
            yield route
        finally:
            route.drain(quiet=True)
