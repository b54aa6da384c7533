"""The replies of worker/proto/shard.proto that the client reads, as Protocols.

The generated ``_pb2`` modules exist only at run time (worker.stubs builds them into the workspace), so
the type checker cannot see their message classes; these Protocols state the fields the client relies
on, named and typed as the proto declares them (repeated fields are sequences, enums are ints).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tensor(Protocol):
    dtype: int  # DType: 1 F32, 2 F16
    shape: Sequence[int]
    data: bytes


class MemoryAccount(Protocol):
    weight_bytes: int
    kv_bytes: int
    compute_bytes: int
    has_token_embedding: bool
    has_output_head: bool
    load_mode: str
    huge_page_bytes: int


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


class TokenizeReply(Protocol):
    tokens: Sequence[int]


class DetokenizeReply(Protocol):
    text: str
