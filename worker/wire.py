"""The messages of worker/proto/shard.proto that the client and the driver read, as Protocols.

The generated ``_pb2`` modules exist only at run time (worker.stubs builds them into the workspace), so
the type checker cannot see their message classes; these Protocols state the fields the client and the
driver (pipeline/sink.py, ring.py, routes.py) rely on, named and typed as the proto declares them
(repeated fields are sequences, enums are ints).  ``FailedCall`` is the one part of grpc's own surface
read here: the trailing metadata of a failed call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tensor(Protocol):
    dtype: int  # DType: 1 F32, 2 F16
    shape: Sequence[int]
    data: bytes


class LayerBytes(Protocol):
    layer: int
    bytes: int


class MemoryAccount(Protocol):
    weight_bytes: int
    kv_bytes: int
    compute_bytes: int
    has_token_embedding: bool
    has_output_head: bool
    load_mode: str
    huge_page_bytes: int
    kv_layers: Sequence[LayerBytes]
    kv_unread_bytes: int


class InfoReply(Protocol):
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
    memory: MemoryAccount
    identity_json: str
    n_batch: int
    max_rewind: int
    mtp: bool
    pass_port: int
    cpus: str
    transport: str
    pass_frames: str
    census: Sequence[LayerState]


class LayerState(Protocol):
    layer: int
    kind: str
    entries_held: int
    rows: int
    candidates_max: int
    selected_at_max: int
    excluding_rows: int
    window_max: int
    raw_cells: int


class LayerCapture(Protocol):
    layer: int
    residual: Tensor


class ForwardReply(Protocol):
    boundary: Tensor
    logits: Tensor
    captures: Sequence[LayerCapture]
    compute_seconds: float
    kv_used: int
    draft: Sequence[int]
    accepted: int

    def HasField(self, field_name: str) -> bool: ...


class HealthReply(Protocol):
    serving: bool
    status: str


class ResetReply(Protocol):
    existed: bool


class SessionReply(Protocol):
    epoch: int
    n_past: int
    state_bytes: int


class TokenizeReply(Protocol):
    tokens: Sequence[int]


class DetokenizeReply(Protocol):
    text: str


class Ring(Protocol):
    """What a ring's first pass carries (the driver builds it, every stage reads it)."""

    budget: int
    stop_tokens: Sequence[int]
    stages: Sequence[str]
    index: int
    max_position: int
    pass_timeout_ms: int
    draft: int
    stream: bool
    tokens_only: bool
    delivery_stream: str


class RingToken(Protocol):
    """A ring delivery's token (or, RING_FAILED, where and why its pass failed)."""

    token: int
    index: int
    end: int  # RingEnd: 0 continues, 1 budget, 2 stop_token, 3 context_full, 4 failed
    failed_stage: int
    code: str
    detail: str
    tokens: Sequence[int]
    drafted: int


class Hop(Protocol):
    """One stage's record of a chained pass."""

    stage: int
    layer_begin: int
    layer_end: int
    compute_seconds: float
    received_ns: int
    sent_ns: int
    boundary_bytes: int
    boundary: Tensor


class Delivery(Protocol):
    """What the last stage delivers to the driver's sink (a Deliver call's request, or a frame on the
    delivery port)."""

    request_id: str
    reply: ForwardReply
    trace: Sequence[Hop]
    ring: RingToken

    def HasField(self, field_name: str) -> bool: ...
