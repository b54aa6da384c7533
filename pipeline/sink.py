"""The driver's end of chained forwarding: a gRPC ``PipelineSink`` the last stage delivers logits to.

In a chained pass the driver sends one request to stage 0; every stage hands its boundary straight
to the next, and the last stage calls ``Deliver`` here.  The driver announces each pass with
``expect(request_id)`` *before* sending it and waits on the returned future.  A delivery nobody
awaits (an unknown or already answered request id, a pass the driver gave up on) is refused with
FAILED_PRECONDITION and counted in ``refused``, so a stray or duplicated delivery is never taken
for the answer of another pass.

    with Sink(pb2, pb2_grpc, host="127.0.0.1") as sink:   # port 0: a free one
        waiting = sink.expect(rid)
        ... stage0.forward_chained(..., deliver_to=sink.address, request_id=rid) ...
        got = waiting.result(timeout)                       # Received

``host`` must be an address the last stage can reach (in network namespaces: the driver's side of
its link, not loopback).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Generator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import cast

import grpc
import numpy as np

from core.digits import ascii_int
from core.errors import ConfigurationError
from worker import wire
from worker.client import (
    CHANNEL_OPTIONS,
    ChainAck,
    StageClient,
    StageFailed,
    StageInfo,
    decode_tensor,
    ended_stage,
    rpc_status,
)
from worker.tls import Identity, server_credentials

FAILED_STAGE = "dgr-failed-stage"  # trailer of a chained failure: the index of the stage it belongs to


@dataclass(frozen=True, kw_only=True)
class Received:
    delivery: wire.Delivery
    received_at: float  # time.perf_counter() on arrival, for the driver's wall clock


class Sink:
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
        self._pb2 = pb2
        self._tls = tls  # workers started with --tls deliver over mutual TLS, to this identity
        self._pb2_grpc = pb2_grpc
        self._host = host
        self._port = port
        self._threads = threads
        self._lock = threading.Lock()
        self._waiting: dict[str, futures.Future[Received]] = {}
        self._server: grpc.Server | None = None
        self.address = ""
        self.refused = 0
        self.delivered = 0

    # Lifecycle ---------------------------------------------------------------------------------
    def start(self) -> str:
        """Bind and serve; return ``host:port``.  ConfigurationError when the host cannot be bound."""
        if self._server is not None:
            return self.address
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="dgr-sink"),
            options=CHANNEL_OPTIONS,
        )
        servicer = type("_SinkServicer", (self._pb2_grpc.PipelineSinkServicer,), {"Deliver": self._deliver})()
        self._pb2_grpc.add_PipelineSinkServicer_to_server(servicer, server)
        host = f"[{self._host}]" if ":" in self._host and not self._host.startswith("[") else self._host
        try:
            where = f"{host}:{self._port}"
            port = (
                server.add_insecure_port(where)
                if self._tls is None
                else server.add_secure_port(where, server_credentials(self._tls))
            )
        except RuntimeError:
            port = 0
        if not port:
            server.stop(None)
            raise ConfigurationError(
                f"the driver's sink cannot listen on {host}:{self._port}",
                hint="sink_host must be an address of this machine that the last stage can reach",
            )
        server.start()
        self._server = server
        self.address = f"{host}:{port}"
        return self.address

    def stop(self, grace: float = 1.0) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            fut.cancel()

    def __enter__(self) -> Sink:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Passes ------------------------------------------------------------------------------------
    def expect(self, request_id: str) -> futures.Future[Received]:
        """A future that resolves with the delivery of ``request_id``; call before sending the pass."""
        fut: futures.Future[Received] = futures.Future()
        with self._lock:
            if request_id in self._waiting:
                raise ValueError(f"request id {request_id!r} is already awaited")
            self._waiting[request_id] = fut
        return fut

    def forget(self, request_id: str) -> None:
        """Stop awaiting a pass (it failed or timed out): a late delivery of it is refused."""
        with self._lock:
            fut = self._waiting.pop(request_id, None)
        if fut is not None:
            fut.cancel()

    def _deliver(self, request: wire.Delivery, context: grpc.ServicerContext) -> object:
        received_at = time.perf_counter()
        with self._lock:
            fut = self._waiting.pop(request.request_id, None)
            if fut is None:
                self.refused += 1
            else:
                self.delivered += 1
        if fut is None or not fut.set_running_or_notify_cancel():
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no pass {request.request_id!r} is awaited by this driver",
            )
        fut.set_result(Received(delivery=request, received_at=received_at))
        return self._pb2.DeliveryAck()


def _trailers(exc: grpc.RpcError) -> dict[str, str | bytes]:
    """A failed call's trailing metadata by key; none for an RpcError that is not also a grpc.Call.

    typeshed's grpc stubs declare ``trailing_metadata`` on every RpcError, its entries as objects with
    a key and a value; grpc has it only on a failed call's error, and gives (key, value) pairs, the
    value a str unless its key ends in -bin."""
    if not hasattr(exc, "trailing_metadata"):
        return {}
    return dict(cast(Sequence[tuple[str, str | bytes]], exc.trailing_metadata() or ()))


# One chained pass, from the driver's side ---------------------------------------------------------
_HOP_FAILURE = re.compile(r"^(stage \d+ at \S+|delivering to the sink at \S+): ([A-Z_]+): (.*)$", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class ChainedPass:
    """What a chained pass brought back: the last stage's logits and every stage's hop, the hops
    checked against the placement (the tensors' shapes are the driver's to check, pipeline.drive)."""

    logits: np.ndarray  # float32, [rows, n_vocab] when the chain is sound
    hops: tuple[wire.Hop, ...]  # per stage, stage 0 first
    boundaries: tuple[np.ndarray, ...]  # per seam, float32, only with keep_boundaries
    wall_seconds: float  # driver: request sent -> delivery received
    draft: tuple[int, ...] = ()  # MTP last stage: the tokens it drafted to follow this pass
    accepted: int = 0  # MTP last stage: how many of the pass's drafted tokens stood


class ChainRoute:
    """Runs chained passes over ``stages`` (StageClients, in order) and collects their acks.

    A pass returns at its delivery; its ack (which comes back through every stage afterwards) is
    collected at the next pass or at ``drain``, so the ack path stays off the measured critical path
    while no call is ever left in flight when the caller resets a session.
    """

    def __init__(
        self, stages: Sequence[StageClient], infos: Sequence[StageInfo], sink: Sink, addresses: Sequence[str]
    ) -> None:
        if len(addresses) != len(stages):
            raise ConfigurationError(f"{len(addresses)} stage addresses for {len(stages)} stages")
        self.stages = list(stages)
        self.infos = list(infos)
        self.sink = sink
        self.addresses = list(addresses)
        self._acks: list[ChainAck] = []

    def run(
        self,
        session: str,
        epoch: int,
        positions: Sequence[int],
        tokens: Sequence[int],
        *,
        boundary_dtype: str,
        all_logits: bool,
        keep_boundaries: bool,
        rewind: bool = False,
        draft: int = 0,
        drafted: int = 0,
    ) -> ChainedPass:
        first = self.stages[0]
        request_id = uuid.uuid4().hex
        waiting = self.sink.expect(request_id)
        wake = threading.Event()
        started = time.perf_counter()
        ack = first.forward_chained(
            session,
            epoch,
            positions,
            tokens=tokens,
            downstream=self.addresses[1:],
            deliver_to=self.sink.address,
            request_id=request_id,
            boundary_dtype=boundary_dtype,
            all_logits=all_logits,
            keep_boundaries=keep_boundaries,
            rewind=rewind,
            draft=draft,
            drafted=drafted,
        )
        got = self._delivery(request_id, waiting, ack, wake)
        self._collect(block=True)  # earlier passes' acks: long done by now
        if ack.done():
            self._raise_if_failed(ack)
        else:
            self._acks.append(ack)
        return self._check(got, started, keep_boundaries=keep_boundaries)

    def _delivery(
        self, request_id: str, waiting: futures.Future[Received], ack: ChainAck, wake: threading.Event
    ) -> Received:
        """The pass's delivery, once it or the ack (a failure) is in; DEADLINE_EXCEEDED when neither
        came within the first stage's deadline, BAD_REPLY when the chain acknowledged a pass it never
        delivered."""
        first = self.stages[0]
        ack.add_done_callback(lambda _: wake.set())
        waiting.add_done_callback(lambda _: wake.set())
        # gRPC ends the call at its deadline; the margin only guards against a lost callback
        wake.wait(first.deadline + 5.0)
        if not waiting.done():
            self.sink.forget(request_id)
            if not ack.done():
                ack.cancel()
                raise first.failure(
                    "DEADLINE_EXCEEDED", f"chained pass got no delivery within {first.deadline:.1f} s"
                )
            self._raise_if_failed(ack)
            raise self.stages[-1].failure("BAD_REPLY", "the chain acknowledged a pass it never delivered")
        return waiting.result()

    def drain(self, *, quiet: bool = False) -> None:
        """Wait for every outstanding ack; raise the first failure unless ``quiet``."""
        try:
            self._collect(block=True)
        except StageFailed:
            if not quiet:
                raise
        finally:
            self._acks.clear()

    def _collect(self, *, block: bool) -> None:
        while self._acks:
            ack = self._acks[0]
            if not block and not ack.done():
                return
            self._acks.pop(0)
            try:
                ack.result(timeout=self.stages[0].deadline + 5.0)
            except grpc.FutureTimeoutError:
                ack.cancel()
                raise self.stages[0].failure("DEADLINE_EXCEEDED", "the chain's ack never came back") from None
            except grpc.RpcError as exc:
                raise self.failure(exc) from None

    def _raise_if_failed(self, ack: ChainAck) -> None:
        try:
            ack.result(timeout=0)
        except grpc.RpcError as exc:
            raise self.failure(exc) from None

    def failure(self, exc: grpc.RpcError) -> StageFailed:
        """The StageFailed of a chain error: a stage whose worker died explains it best; else the
        stage the dgr-failed-stage trailer names (none: stage 0 itself), with the status code kept."""
        code, detail = rpc_status(exc)
        named = str(_trailers(exc).get(FAILED_STAGE, ""))
        named_stage = ascii_int(named)
        k = named_stage if named_stage is not None and named_stage < len(self.stages) else 0
        dead = ended_stage(self.stages, code)
        if dead is not None:
            return dead.explain("chained Forward", code, detail, settle=False)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and not named:
            # every hop shares the driver's deadline, so which one hung is not known here
            return self.stages[0].failure(
                code.name,
                f"chained pass got no delivery within "
                f"{self.stages[0].deadline:.1f} s (this stage or one after it "
                f"did not answer)",
            )
        hop = _HOP_FAILURE.match(detail or "")
        if hop:
            detail = f"{hop.group(1)}: {hop.group(3)}"
        return self.stages[k].explain("chained Forward", code, detail, settle=False)

    def _check(
        self, got: Received, started: float, *, keep_boundaries: bool, logits: bool = True
    ) -> ChainedPass:
        """The delivery as a ChainedPass, its hops held to the placement; ``logits=False`` (a token-only
        ring): it must carry no logits, and the pass's are [0, n_vocab]."""
        d = got.delivery
        last = self.stages[-1]
        hops = tuple(d.trace)
        where = [(h.stage, h.layer_begin, h.layer_end) for h in hops]
        want = [(k, i.layer_begin, i.layer_end) for k, i in enumerate(self.infos)]
        if where != want:
            raise last.failure("BAD_REPLY", f"delivered hops {where}, expected {want}")
        if not logits and d.reply.HasField("logits"):
            raise last.failure("BAD_REPLY", "a token-only ring delivered logits")
        try:
            rows = (
                decode_tensor(d.reply.logits, what="logits")
                if logits
                else np.empty((0, self.infos[-1].n_vocab), dtype=np.float32)
            )
            boundaries = (
                tuple(
                    decode_tensor(h.boundary, what=f"boundary of stage {k}") for k, h in enumerate(hops[:-1])
                )
                if keep_boundaries
                else ()
            )
        except ValueError as exc:
            raise last.failure("BAD_REPLY", f"the delivery carries {exc}") from None
        return ChainedPass(
            logits=rows,
            hops=hops,
            boundaries=boundaries,
            wall_seconds=got.received_at - started,
            draft=tuple(int(t) for t in d.reply.draft),
            accepted=int(d.reply.accepted),
        )


@contextmanager
def chain_route(
    stages: Sequence[StageClient],
    infos: Sequence[StageInfo],
    *,
    addresses: Sequence[str] | None,
    sink_host: str,
) -> Generator[ChainRoute]:
    """A sink on ``sink_host`` and a route over ``stages``; outstanding acks are awaited on exit."""
    first = stages[0]
    with Sink(first.pb2, first.pb2_grpc, host=sink_host, tls=first.tls) as sink:
        where = addresses if addresses is not None else [s.address for s in stages]
        route = ChainRoute(stages, infos, sink, where)
        try:
            yield route
        finally:
            route.drain(quiet=True)
