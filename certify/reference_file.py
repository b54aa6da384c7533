"""The sealed reference's one file: a GGUF container of float32 tensors with a JSON header.

GGUF, not npz, because the artifact machinery (``dgr seal``, ``dgr provision``: chunk and whole-file
digests, resumable verified copies from any origin) holds every file to a GGUF header with an
architecture and a block count, and our bounded header reader (fetch.gguf_header, fuzzed) is what
reads an untrusted file's layout.  So a reference is an artifact set like any model: architecture
``dgr_reference``, ``dgr_reference.block_count`` = the recipe's layers, and the identity chain as
KV pairs the manifest can pin.

Contents (all float32, little-endian, exact copies of what the worker returned, so a CPU comparison
against the file is bitwise the comparison against the live run):

* ``dgr_reference.header``: canonical JSON (``HEADER_KIND``): recipe, lane, identity chain, hardware,
  per prompt the prompt tokens, the greedy continuation and the logit positions, the cuts, the
  monolithic speed figures and its route change;
* ``free.p{i}.logits`` ``[rows, n_vocab]``: the raw logits of every position fed (free-running greedy
  on the lane's own tokens, which is teacher forcing on its own continuation).  Raw logits, not
  log-probabilities: log-softmax drops the per-row constant that the logits NMSE gate sees, and both
  KL and top-1 follow from the logits exactly;
* ``free.p{i}.capture.{cut}`` ``[positions, width]``: the residual entering layer ``cut``;
* ``forced.p{i}.*``: the same, teacher-forced on another reference's tokens (a lane reference made
  against a CPU reference, for backend agreement), when present.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from core.canonical import canonical_bytes, parse_json
from core.errors import ConfigurationError, IntegrityError
from fetch import gguf_header
from manifests.loader import validate

ARCH = "dgr_reference"
HEADER_KIND = "dgr.sealed-reference"
SCHEMA = "reference"  # manifests/schemas/reference.schema.json
FORMAT_VERSION = 1
ALIGNMENT = 32
_F32 = 0  # ggml type
_T_U32, _T_STRING = 4, 8


@dataclass(frozen=True, kw_only=True)
class Tensor:
    name: str
    array: np.ndarray  # 2-D float32, C order


def tensor_names(prefix: str, n_prompts: int, cuts: Sequence[int]) -> list[str]:
    names = []
    for i in range(n_prompts):
        names.append(f"{prefix}.p{i}.logits")
        names += [f"{prefix}.p{i}.capture.{c}" for c in sorted(cuts)]
    return names


def _string(out: BinaryIO, s: str) -> None:
    raw = s.encode("utf-8")
    out.write(struct.pack("<Q", len(raw)) + raw)


def _kv(out: BinaryIO, key: str, value: str | int) -> None:
    _string(out, key)
    if isinstance(value, str):
        out.write(struct.pack("<I", _T_STRING))
        _string(out, value)
    else:
        out.write(struct.pack("<II", _T_U32, value))


def write(path: Path, header: Mapping[str, Any], kv: Mapping[str, str], tensors: Sequence[Tensor]) -> int:
    """Write the file (same inputs, same bytes); returns its size.  ``kv``: identity strings also put
    beside the header as their own keys (``dgr_reference.<key>``) so a manifest can pin them."""
    n_layer = int(header["n_layer"])
    pairs: list[tuple[str, str | int]] = [
        ("general.architecture", ARCH),
        ("general.alignment", ALIGNMENT),
        (f"{ARCH}.block_count", n_layer),
        (f"{ARCH}.format_version", FORMAT_VERSION),
        *((f"{ARCH}.{k}", str(v)) for k, v in sorted(kv.items())),
        (f"{ARCH}.header", canonical_bytes(dict(header)).decode("utf-8")),
    ]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(pairs)))
        for key, value in pairs:
            _kv(out, key, value)
        offset = 0
        spans = []
        for t in tensors:
            a = np.ascontiguousarray(t.array, dtype="<f4")
            if a.ndim != 2:
                raise ValueError(f"{t.name}: reference tensors are 2-D, got shape {a.shape}")
            _string(out, t.name)
            # GGUF lists dimensions fastest first: [rows, cols] is ne = (cols, rows)
            out.write(struct.pack("<IQQIQ", 2, a.shape[1], a.shape[0], _F32, offset))
            spans.append((offset, a))
            offset += -(-a.nbytes // ALIGNMENT) * ALIGNMENT
        out.write(b"\0" * (-out.tell() % ALIGNMENT))
        base = out.tell()
        for start, a in spans:
            out.write(b"\0" * (base + start - out.tell()))
            out.write(a.tobytes())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return path.stat().st_size


@dataclass(frozen=True, kw_only=True)
class Contents:
    header: Mapping[str, Any]
    kv: Mapping[str, Any]
    tensors: Mapping[str, np.ndarray]


def read(path: Path) -> Contents:
    """Read a reference file (already verified against its manifest): the header through the bounded
    GGUF reader and the bounded JSON parser, then every tensor the header names, shape-checked.
    The tensors are read into memory in one pass (never mapped: the bytes checked are the bytes used)."""
    h = gguf_header.read_header(path)
    name = path.name
    if h.architecture != ARCH:
        raise IntegrityError(f"{name}: architecture {h.architecture!r} is not a sealed reference ({ARCH})")
    version = h.kv.get(f"{ARCH}.format_version")
    if version != FORMAT_VERSION:
        raise IntegrityError(f"{name}: reference format {version!r}, this release reads {FORMAT_VERSION}")
    raw = h.kv.get(f"{ARCH}.header")
    if not isinstance(raw, str):
        raise IntegrityError(f"{name}: no {ARCH}.header")
    header = parse_json(raw, source=f"{name} header")
    if not isinstance(header, dict) or header.get("kind") != HEADER_KIND:
        raise IntegrityError(f"{name}: the header is not a {HEADER_KIND}")
    try:  # everything the checks and the traces index, typed and bounded before anything reads it
        validate(header, SCHEMA, source=f"{name} header")
    except ConfigurationError as exc:
        raise IntegrityError(exc.message) from None
    infos = {t.name: t for t in h.tensors}
    tensors: dict[str, np.ndarray] = {}
    with open(path, "rb") as fh:
        for tname, shape in _expected_shapes(header):
            info = infos.get(tname)
            if info is None:
                raise IntegrityError(f"{name}: tensor {tname} is missing")
            if info.ggml_type != _F32 or info.shape != (shape[1], shape[0]):
                raise IntegrityError(
                    f"{name}: tensor {tname} is type {info.ggml_type} shape "
                    f"{info.shape}, the header says f32 {shape[1]}x{shape[0]}"
                )
            fh.seek(h.data_offset + info.offset)
            buf = fh.read(info.nbytes)
            if len(buf) != info.nbytes:
                raise IntegrityError(f"{name}: tensor {tname} is cut short")
            tensors[tname] = np.frombuffer(buf, dtype="<f4").reshape(shape).astype(np.float32, copy=False)
    return Contents(header=header, kv=dict(h.kv), tensors=tensors)


def _expected_shapes(header: Mapping[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    n_vocab, width = int(header["n_vocab"]), int(header["width"])
    cuts = [int(c) for c in header["cuts"]]
    out = []
    for prefix in ("free", "forced"):
        section = header.get(prefix)
        if not section:
            continue
        for i, p in enumerate(section["prompts"]):
            rows = len(p["logit_positions"])
            out.append((f"{prefix}.p{i}.logits", (rows, n_vocab)))
            out += [(f"{prefix}.p{i}.capture.{c}", (rows, width)) for c in cuts]
    return out
