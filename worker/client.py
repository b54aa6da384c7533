"""A typed client for one shard worker (one pipeline stage): numpy arrays in and out, deadlines on
every call, and gRPC errors turned into ``StageFailed`` ("stage K (layers a:b) failed: ...").

The client never interprets the model; it checks only what the wire promises (a tensor's bytes match
its dtype and shape), so a worker answering with a malformed tensor fails here with the stage named
(RELIABILITY 20) instead of as a numpy error three frames later.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Literal, TypeAlias, overload

import grpc
import numpy as np

from core.errors import RuntimeFailure
from worker import wire
from worker.tls import Identity, channel_credentials

# Logits of a long prompt over a large vocabulary exceed gRPC's 4 MiB default by far.
MAX_MESSAGE_BYTES = (1 << 31) - 1
# Workers are reached directly: an http(s)_proxy in the environment must never capture a seam.
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_http_proxy", 0),
)

DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2")}

# A chained pass's acknowledgement: the first stage's Forward call, done once every stage has handed on.
# grpc's Future is generic in its type stubs only, so the alias stays a string at run time.
ChainAck: TypeAlias = "grpc.Future[wire.ForwardReply]"


class StageFailed(RuntimeFailure):
    """A stage's call failed; ``code`` is the gRPC status name (or ``DIED`` / ``BAD_REPLY``)."""

    def __init__(self, stage: int, layers: tuple[int, int], code: str, detail: str) -> None:
        self.stage = stage
        self.layers = layers
        self.code = code
        self.detail = detail
        super().__init__(
            f"stage {stage} (layers {layers[0]}:{layers[1]}) failed: {code}: {detail}",
            hint="the worker's stderr is kept in the run's evidence folder",
        )


@dataclass(frozen=True, kw_only=True)
class Memory:
    weight_bytes: int
    kv_bytes: int
    compute_bytes: int
    has_token_embedding: bool
    has_output_head: bool
    load_mode: str = ""  # how the weights were loaded (llama's name: none, mmap, ...); "": an older worker
    huge_page_bytes: int = -1  # the worker's memory on transparent huge pages at Info time; -1: unknown
    # The memory the stage's graph reads, by layer (-1: a tensor naming no layer), and what it allocated
    # that no node reads (worker/src/memory_layers.h); empty and 0 from an older worker.
    kv_bytes_by_layer: Mapping[int, int] = field(default_factory=dict)
    kv_unread_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class StageInfo:
    worker_version: str
    llama_commit: str
    lane: str
    backend_devices: str
    model_path: str
    architecture: str
    n_layer: int
    layer_begin: int
    layer_end: int
    first_stage: bool
    last_stage: bool
    n_embd: int
    boundary_width: int
    needs_token_sideband: bool
    n_vocab: int
    n_ctx: int
    n_threads: int
    n_batch: int  # most positions one Forward may carry (0: the worker did not say)
    memory: Memory
    identity_json: str
    max_rewind: int = 0  # most positions a rewinding Forward may take back (speculative decoding)
    mtp: bool = False  # the last stage drafts with the model's nextn block (--mtp)
    pass_port: int = 0  # TCP port taking a streamed ring's passes (Ring.stream); 0: none (older workers)
    cpus: str = ""  # the CPU list the worker's threads are held to (--cpus); "": free (or an older worker)
    # the gRPC port's security: "mtls", "plaintext-loopback", "plaintext-insecure"; "": an older worker
    transport: str = ""
    # the pass port's frames: "tls", "mac" (authenticated frames where the other end allows them too),
    # "plaintext"; "": an older worker
    pass_frames: str = ""
    # --census workers: per layer, the compressed and sliding-window state their passes filled so far
    census: tuple[LayerState, ...] = ()


@dataclass(frozen=True, kw_only=True)
class LayerState:
    """One layer's state as a --census worker counted it (worker/src/state_census.h): the compressed
    entries its attention saw, the indexer's candidates and selections (csa), the sliding window."""

    layer: int
    kind: str  # "csa" (ratio-4, indexed) or "hca" (ratio-128)
    entries_held: int
    rows: int
    candidates_max: int
    selected_at_max: int
    excluding_rows: int
    window_max: int
    raw_cells: int


@dataclass(frozen=True, kw_only=True)
class SessionFigures:
    """What one session holds on a stage (the Session RPC)."""

    epoch: int
    n_past: int  # positions held
    state_bytes: int  # its state as llama would save it: cache rows and cells of the owned layers


@dataclass(frozen=True, kw_only=True)
class Forwarded:
    """One Forward call's answer, decoded.

    ``boundary_wire`` is the tensor exactly as the worker sent it; the driver relays it unchanged to
    the next stage so an f16 seam is not re-encoded.  ``boundary`` is the same data as float32.
    """

    boundary: np.ndarray | None
    boundary_wire: wire.Tensor | None  # as the worker sent it
    boundary_bytes: int  # payload bytes of the boundary on the wire (0 on the last stage)
    logits: np.ndarray | None
    captures: dict[int, np.ndarray] = field(default_factory=dict)
    compute_seconds: float
    wall_seconds: float  # client-side round trip of the call
    draft: tuple[int, ...] = ()  # MTP last stage: the tokens it drafted to follow this pass
    accepted: int = 0  # MTP last stage: how many of the pass's drafted tokens stood


def decode_tensor(tensor: wire.Tensor, *, what: str) -> np.ndarray:
    """A pb2 Tensor as a float32 numpy array; ValueError naming ``what`` when bytes and shape disagree."""
    dtype_name = {1: "f32", 2: "f16"}.get(int(tensor.dtype))
    if dtype_name is None:
        raise ValueError(f"{what} has unknown dtype {int(tensor.dtype)}")
    shape = tuple(int(d) for d in tensor.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"{what} has a negative dimension in shape {list(shape)}")
    dtype = DTYPES[dtype_name]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    data = tensor.data
    if len(data) != expected:
        raise ValueError(
            f"{what} is {dtype_name} {list(shape)} ({expected} bytes) but carries {len(data)} bytes"
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    # f32 stays a read-only view of the reply's bytes (a decode step's logits are not copied twice).
    return array if dtype_name == "f32" else array.astype(np.float32)


def rpc_status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """A failed call's status code and detail (None and the error's text when it carries no status)."""
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else None
    return code, detail if detail is not None else str(exc)


def ended_stage(
    stages: Sequence[StageClient], code: grpc.StatusCode | None, *, settle: bool = True
) -> StageClient | None:
    """The first of ``stages`` whose worker process has ended, or None.

    With ``settle``, a dropped connection (UNAVAILABLE, CANCELLED) gets one short wait before
    concluding that no worker died: a worker killed mid-call is often reaped a moment after the reset.
    """
    for waited in (False, True):
        dead = next((s for s in stages if s.ended() is not None), None)
        if dead is not None or waited or not settle:
            return dead
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return None
        time.sleep(0.2)
    return None


class StageClient:
    """Calls to one worker.  ``stage`` and ``layers`` only label errors; ``Info`` says the truth.

    ``liveness`` (set by the launcher) returns how the worker process ended and the tail of its stderr,
    or None while it runs, so a dropped connection is reported as "worker was killed by SIGKILL"
    rather than a bare UNAVAILABLE.  ``tls``: this end's identity for a worker started with --tls
    (mutual TLS: the worker must chain to its CA, and it checks ours).
    """

    def __init__(
        self,
        address: str,
        pb2: ModuleType,
        pb2_grpc: ModuleType,
        *,
        stage: int,
        layers: tuple[int, int],
        deadline: float = 120.0,
        liveness: Callable[[], tuple[str, str] | None] | None = None,
        tls: Identity | None = None,
    ) -> None:
        self.address = address
        self.stage = stage
        self.layers = layers
        self.deadline = deadline
        self._pb2 = pb2
        self._pb2_grpc = pb2_grpc
        self._liveness = liveness
        self.tls = tls  # the driver's sink serves the workers with it too (pipeline.sink)
        self._channel = (
            grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            if tls is None
            else grpc.secure_channel(address, channel_credentials(tls), options=CHANNEL_OPTIONS)
        )
        self._stub = pb2_grpc.ShardWorkerStub(self._channel)

    # Plumbing ---------------------------------------------------------------------------------
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> StageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pb2(self) -> ModuleType:
        return self._pb2

    @property
    def pb2_grpc(self) -> ModuleType:
        return self._pb2_grpc

    def failure(self, code: str, detail: str) -> StageFailed:
        return StageFailed(self.stage, self.layers, code, detail)

    def ended(self) -> tuple[str, str] | None:
        """How the worker process ended and its last stderr, or None (running, or not ours to watch)."""
        return self._liveness() if self._liveness else None

    def explain(
        self,
        name: str,
        code: grpc.StatusCode | None,
        detail: str,
        *,
        deadline: float | None = None,
        settle: bool = True,
    ) -> StageFailed:
        """The StageFailed for a failed call: DIED when the worker process has ended, else the status.

        ``settle`` waits a moment before concluding a dropped connection was not a death.
        """
        died = self.ended() if ended_stage((self,), code, settle=settle) is not None else None
        if died is not None:
            how, tail = died
            last = f"; last stderr: {tail}" if tail else ""
            return self.failure("DIED", f"worker {how} during {name} ({detail}){last}")
        status = code.name if code is not None else "UNKNOWN"
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            limit = self.deadline if deadline is None else deadline
            return self.failure(status, f"{name} got no reply within {limit:.1f} s")
        return self.failure(status, f"{name}: {detail}")

    @overload
    def _call(self, name: Literal["Health"], request: object, deadline: float | None) -> wire.HealthReply: ...
    @overload
    def _call(self, name: Literal["Info"], request: object, deadline: float | None) -> wire.InfoReply: ...
    @overload
    def _call(self, name: Literal["Reset"], request: object, deadline: float | None) -> wire.ResetReply: ...
    @overload
    def _call(
        self, name: Literal["Session"], request: object, deadline: float | None
    ) -> wire.SessionReply: ...
    @overload
    def _call(
        self, name: Literal["Tokenize"], request: object, deadline: float | None
    ) -> wire.TokenizeReply: ...
    @overload
    def _call(
        self, name: Literal["Detokenize"], request: object, deadline: float | None
    ) -> wire.DetokenizeReply: ...
    @overload
    def _call(
        self, name: Literal["Forward"], request: object, deadline: float | None
    ) -> wire.ForwardReply: ...
    def _call(self, name: str, request: object, deadline: float | None) -> object:
        """One unary RPC of the generated stub (its reply typed by ``worker.wire``), errors explained."""
        try:
            return getattr(self._stub, name)(request, timeout=self.deadline if deadline is None else deadline)
        except grpc.RpcError as exc:
            code, detail = rpc_status(exc)
            raise self.explain(name, code, detail, deadline=deadline) from None

    # RPCs -------------------------------------------------------------------------------------
    def health(self, *, deadline: float | None = 5.0) -> tuple[bool, str]:
        reply = self._call("Health", self._pb2.HealthRequest(), deadline)
        return bool(reply.serving), str(reply.status)

    def info(self, *, deadline: float | None = 30.0) -> StageInfo:
        r = self._call("Info", self._pb2.InfoRequest(), deadline)
        m = r.memory
        return StageInfo(
            worker_version=r.worker_version,
            llama_commit=r.llama_commit,
            lane=r.lane,
            backend_devices=r.backend_devices,
            model_path=r.model_path,
            architecture=r.architecture,
            n_layer=r.n_layer,
            layer_begin=r.layer_begin,
            layer_end=r.layer_end,
            first_stage=r.first_stage,
            last_stage=r.last_stage,
            n_embd=r.n_embd,
            boundary_width=r.boundary_width,
            needs_token_sideband=r.needs_token_sideband,
            n_vocab=r.n_vocab,
            n_ctx=r.n_ctx,
            n_threads=r.n_threads,
            identity_json=r.identity_json,
            n_batch=r.n_batch,
            max_rewind=r.max_rewind,
            mtp=r.mtp,
            pass_port=r.pass_port,
            cpus=r.cpus,
            transport=r.transport,
            pass_frames=r.pass_frames,
            census=tuple(_layer_state(s) for s in r.census),
            memory=Memory(
                weight_bytes=m.weight_bytes,
                kv_bytes=m.kv_bytes,
                compute_bytes=m.compute_bytes,
                has_token_embedding=m.has_token_embedding,
                has_output_head=m.has_output_head,
                load_mode=m.load_mode,
                huge_page_bytes=m.huge_page_bytes if m.load_mode else -1,
                kv_bytes_by_layer={int(x.layer): int(x.bytes) for x in m.kv_layers},
                kv_unread_bytes=m.kv_unread_bytes,
            ),
        )

    def reset(self, session_id: str, *, deadline: float | None = 30.0) -> bool:
        reply = self._call("Reset", self._pb2.ResetRequest(session_id=session_id), deadline)
        return bool(reply.existed)

    def session(self, session_id: str, *, deadline: float | None = 30.0) -> SessionFigures:
        """What ``session_id`` holds on this stage now: its positions and its state's bytes as llama
        would save them (KV rows and cells of the owned layers, rolling and compressed caches)."""
        r = self._call("Session", self._pb2.SessionRequest(session_id=session_id), deadline)
        return SessionFigures(epoch=int(r.epoch), n_past=int(r.n_past), state_bytes=int(r.state_bytes))

    def tokenize(self, text: str, *, add_special: bool = True, deadline: float | None = 30.0) -> list[int]:
        request = self._pb2.TokenizeRequest(text=text, add_special=add_special)
        reply = self._call("Tokenize", request, deadline)
        return list(reply.tokens)

    def detokenize(self, tokens: Sequence[int], *, deadline: float | None = 30.0) -> str:
        reply = self._call("Detokenize", self._pb2.DetokenizeRequest(tokens=list(tokens)), deadline)
        return str(reply.text)

    def tensor(self, array: np.ndarray, dtype: str = "f32") -> wire.Tensor:
        """Encode a 2-D float array for the wire (row-major, little-endian)."""
        arr = np.ascontiguousarray(np.asarray(array, dtype=DTYPES[dtype]))
        code = self._pb2.DType.Value(dtype.upper())
        return self._pb2.Tensor(dtype=code, shape=list(arr.shape), data=arr.tobytes())

    def forward(
        self,
        session_id: str,
        epoch: int,
        positions: Sequence[int],
        *,
        tokens: Sequence[int] = (),
        boundary: np.ndarray | wire.Tensor | None = None,
        boundary_dtype: str = "f32",
        all_logits: bool = False,
        capture_layers: Sequence[int] = (),
        rewind: bool = False,
        draft: int = 0,
        drafted: int = 0,
        deadline: float | None = None,
    ) -> Forwarded:
        """Run ``positions`` through this stage.

        ``boundary`` is a numpy array (encoded as f32) or a pb2 Tensor relayed from the previous stage.
        ``boundary_dtype`` asks a non-last stage for f16 or f32 output.  ``rewind``: ``positions[0]``
        may take back held positions (the drafts a speculative pass rejected) first.  ``drafted`` /
        ``draft`` (an MTP last stage): the pass's last tokens are drafts to verify / draft this many after it.
        """
        if isinstance(boundary, np.ndarray):
            boundary = self.tensor(boundary, "f32")
        request = self._pb2.ForwardRequest(
            session_id=session_id,
            epoch=epoch,
            positions=list(positions),
            tokens=list(tokens),
            boundary_dtype=self._pb2.DType.Value(boundary_dtype.upper()),
            all_logits=all_logits,
            capture_layers=list(capture_layers),
            rewind=rewind,
            draft=draft,
            drafted=drafted,
        )
        if boundary is not None:
            request.boundary.CopyFrom(boundary)
        started = time.perf_counter()
        reply = self._call("Forward", request, deadline)
        return self._forwarded(reply, time.perf_counter() - started)

    def _forwarded(self, reply: wire.ForwardReply, wall: float) -> Forwarded:
        """A Forward's reply decoded; a tensor that does not decode is BAD_REPLY."""
        try:
            out = decode_tensor(reply.boundary, what="boundary") if reply.HasField("boundary") else None
            logits = decode_tensor(reply.logits, what="logits") if reply.HasField("logits") else None
            captures = {
                int(c.layer): decode_tensor(c.residual, what=f"capture of layer {c.layer}")
                for c in reply.captures
            }
        except ValueError as exc:
            raise self.failure("BAD_REPLY", f"Forward answered with {exc}") from None
        return Forwarded(
            boundary=out,
            boundary_wire=reply.boundary if out is not None else None,
            boundary_bytes=len(reply.boundary.data) if out is not None else 0,
            logits=logits,
            captures=captures,
            compute_seconds=float(reply.compute_seconds),
            wall_seconds=wall,
            draft=tuple(int(t) for t in reply.draft),
            accepted=int(reply.accepted),
        )

    def forward_chained(
        self,
        session_id: str,
        epoch: int,
        positions: Sequence[int],
        *,
        tokens: Sequence[int],
        downstream: Sequence[str],
        deliver_to: str,
        request_id: str,
        boundary_dtype: str = "f32",
        all_logits: bool = False,
        keep_boundaries: bool = False,
        deadline: float | None = None,
        ring: wire.Ring | None = None,
        rewind: bool = False,
        draft: int = 0,
        drafted: int = 0,
    ) -> ChainAck:
        """Start a chained pass at this (first) stage without waiting: the returned future is the ack,
        which completes once every stage has handed on and the last one has delivered to
        ``deliver_to``.  Its error carries the ``dgr-failed-stage`` trailer naming the failing stage.
        ``ring`` (a pb2 Ring) makes it the first pass of a ring (pipeline/ring.py)."""
        request = self._pb2.ForwardRequest(
            session_id=session_id,
            epoch=epoch,
            positions=list(positions),
            tokens=list(tokens),
            boundary_dtype=self._pb2.DType.Value(boundary_dtype.upper()),
            all_logits=all_logits,
            downstream=list(downstream),
            deliver_to=deliver_to,
            request_id=request_id,
            keep_boundaries=keep_boundaries,
            ring=ring,
            rewind=rewind,
            draft=draft,
            drafted=drafted,
        )
        return self._stub.Forward.future(request, timeout=self.deadline if deadline is None else deadline)


def _layer_state(s: wire.LayerState) -> LayerState:
    return LayerState(
        layer=s.layer,
        kind=s.kind,
        entries_held=s.entries_held,
        rows=s.rows,
        candidates_max=s.candidates_max,
        selected_at_max=s.selected_at_max,
        excluding_rows=s.excluding_rows,
        window_max=s.window_max,
        raw_cells=s.raw_cells,
    )
