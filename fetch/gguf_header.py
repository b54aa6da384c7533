"""Our own bounded GGUF header reader: trust nothing in the file (RELIABILITY 19).

Reads only the header (magic, version, KV pairs, tensor infos) with a cap on every count, length and
the total bytes read, so a hostile file is rejected in bounded time and memory before any worker
touches it.  Tensor data is never read: each tensor's offset and size are checked to lie inside the
file.  ``check_set`` then holds a split set's headers against the manifest's expectations.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from core.errors import IntegrityError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 14
MAX_STRING = 1 << 22  # chat templates run to tens of KiB; 4 MiB is generous
MAX_ARRAY = 1 << 22  # vocabularies hold ~10^5 tokens
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_HEADER_BYTES = 64 << 20  # a real 129k-token vocabulary header is a few MiB
MAX_ALIGNMENT = 1 << 16

# ggml type -> (block size in elements, bytes per block); as in gguf-py's GGML_QUANT_SIZES
_QK_K = 256
TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 40),
    10: (256, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    11: (256, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    12: (256, 2 + 2 + _QK_K // 2 + 12),
    13: (256, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    14: (256, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    15: (256, 4 + _QK_K + _QK_K // 8),
    16: (256, 2 + _QK_K // 4),
    17: (256, 2 + _QK_K // 4 + _QK_K // 32),
    18: (256, 2 + _QK_K // 4 + _QK_K // 8),
    19: (256, 2 + _QK_K // 8 + _QK_K // 16),
    20: (32, 18),
    21: (256, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    22: (256, 2 + _QK_K // 4 + _QK_K // 16),
    23: (256, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    30: (1, 2),
    34: (256, 2 + 4 * 13),
    35: (256, 2 + 64),
    39: (32, 17),
    40: (64, 36),
    41: (128, 18),
    42: (64, 18),
}

# GGUF value types
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
T_STRING, T_ARRAY = 8, 9


class MalformedGGUF(IntegrityError):
    """Every message says what to do: the usual causes are a truncated copy or a file that is no GGUF."""

    HINT = (
        "the file is not a usable GGUF model: if it is in the store, run `dgr provision --reverify` "
        "to fetch it again; if you named it (dgr seal --from DIR), give the complete .gguf files"
    )

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or self.HINT)


@dataclass(frozen=True, kw_only=True)
class ArrayInfo:
    item_type: int
    count: int


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class Header:
    path: Path
    version: int
    kv: Mapping[str, Any]  # scalars and strings by value, arrays as ArrayInfo
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_size: int
    header_bytes: int = field(default=0)

    @property
    def architecture(self) -> str | None:
        value = self.kv.get("general.architecture")
        return value if isinstance(value, str) else None

    def arch_value(self, suffix: str) -> Any:
        return self.kv.get(f"{self.architecture}.{suffix}") if self.architecture else None


class _Reader:
    def __init__(self, fh: BinaryIO, path: Path, size: int, cap: int) -> None:
        self.fh, self.path, self.size, self.cap, self.pos = fh, path, size, cap, 0

    def bad(self, what: str) -> MalformedGGUF:
        return MalformedGGUF(f"{self.path.name}: malformed GGUF header at byte {self.pos}: {what}")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.bad(f"needs {n} bytes past the end of the file ({self.size} bytes)")
        if self.pos + n > self.cap:
            raise self.bad(f"header larger than the {self.cap}-byte cap")
        data = self.fh.read(n)
        if len(data) != n:
            raise self.bad("short read")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size or self.pos + n > self.cap:
            raise self.bad(f"a {n}-byte value runs past the end of the file or the header cap")
        self.fh.seek(n, os.SEEK_CUR)
        self.pos += n

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return self.scalar("<I")

    def u64(self) -> int:
        return self.scalar("<Q")

    def string(self, *, keep: bool = True) -> str | None:
        n = self.u64()
        if n > MAX_STRING:
            raise self.bad(f"string length {n} exceeds the cap of {MAX_STRING}")
        if not keep:
            self.skip(n)
            return None
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad("string is not UTF-8") from None

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            if depth > 0:
                raise self.bad("nested arrays are not accepted")
            item = self.u32()
            count = self.u64()
            if count > MAX_ARRAY:
                raise self.bad(f"array length {count} exceeds the cap of {MAX_ARRAY}")
            if count * (8 if item == T_STRING else 1) > self.size - self.pos:
                raise self.bad(f"array of {count} items cannot fit in the rest of the file")
            if item in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item]))
            elif item == T_STRING:
                for _ in range(count):
                    self.string(keep=False)
            else:
                raise self.bad(f"unknown array item type {item}")
            return ArrayInfo(item_type=item, count=count)
        raise self.bad(f"unknown value type {vtype}")


def read_header(path: Path, *, max_header_bytes: int = MAX_HEADER_BYTES, fd: int | None = None) -> Header:
    """Parse and bound-check one GGUF file's header; MalformedGGUF (an IntegrityError) otherwise.

    With ``fd``, read that open file (from its start) and use ``path`` only in messages.
    """
    source = os.dup(fd) if fd is not None else path
    with open(source, "rb", buffering=1 << 16) as fh:
        fh.seek(0)
        size = os.fstat(fh.fileno()).st_size
        r = _Reader(fh, path, size, max_header_bytes)
        if r.take(4) != MAGIC:
            raise r.bad("bad magic (not a GGUF file)")
        version = r.u32()
        if version not in VERSIONS:
            raise r.bad(f"unsupported version {version} (accepted: {', '.join(map(str, VERSIONS))})")
        n_tensors, n_kv = r.u64(), r.u64()
        if n_tensors > MAX_TENSORS:
            raise r.bad(f"tensor count {n_tensors} exceeds the cap of {MAX_TENSORS}")
        if n_kv > MAX_KV:
            raise r.bad(f"KV count {n_kv} exceeds the cap of {MAX_KV}")
        kv: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            assert key is not None
            if key in kv:
                raise r.bad(f"duplicate key {key!r}")
            kv[key] = r.value(r.u32())
        alignment = kv.get("general.alignment", 32)
        if (
            not isinstance(alignment, int)
            or alignment <= 0
            or alignment & (alignment - 1)
            or alignment > MAX_ALIGNMENT
        ):
            raise r.bad(f"general.alignment {alignment!r} is not a power of two up to {MAX_ALIGNMENT}")
        tensors = [_tensor_info(r) for _ in range(n_tensors)]
        data_offset = -(-r.pos // alignment) * alignment
        _check_tensor_data(r, tensors, alignment, data_offset, size)
        return Header(
            path=path,
            version=version,
            kv=kv,
            tensors=tuple(tensors),
            alignment=alignment,
            data_offset=data_offset,
            file_size=size,
            header_bytes=r.pos,
        )


def _tensor_info(r: _Reader) -> TensorInfo:
    name = r.string()
    assert name is not None
    n_dims = r.u32()
    if not 1 <= n_dims <= MAX_DIMS:
        raise r.bad(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} accepted)")
    shape = tuple(r.u64() for _ in range(n_dims))
    ggml_type = r.u32()
    offset = r.u64()
    if ggml_type not in TYPE_SIZES:
        raise r.bad(f"tensor {name!r} has unknown ggml type {ggml_type}")
    block, type_size = TYPE_SIZES[ggml_type]
    elements = 1
    for dim in shape:
        if dim == 0 or dim > (1 << 40):
            raise r.bad(f"tensor {name!r} has an absurd dimension {dim}")
        elements *= dim
        if elements > (1 << 48):
            raise r.bad(f"tensor {name!r} has an absurd element count")
    if shape[0] % block:
        raise r.bad(
            f"tensor {name!r}: first dimension {shape[0]} is not a multiple of the block size {block}"
        )
    return TensorInfo(
        name=name, shape=shape, ggml_type=ggml_type, offset=offset, nbytes=elements // block * type_size
    )


def _check_tensor_data(
    r: _Reader, tensors: Sequence[TensorInfo], alignment: int, data_offset: int, size: int
) -> None:
    names: set[str] = set()
    for t in tensors:
        if t.name in names:
            raise r.bad(f"duplicate tensor name {t.name!r}")
        names.add(t.name)
        if t.offset % alignment:
            raise r.bad(f"tensor {t.name!r} offset {t.offset} is not aligned to {alignment}")
        if data_offset + t.offset + t.nbytes > size:
            raise r.bad(
                f"tensor {t.name!r} data ({t.nbytes} bytes at {data_offset + t.offset}) runs past the "
                f"end of the file ({size} bytes)"
            )
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors)
    for (_, end_a, name_a), (start_b, _, name_b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a:
            raise r.bad(f"tensors {name_a!r} and {name_b!r} overlap")


# --- the set against its manifest ------------------------------------------------------------------


def check_file(header: Header, index: int, n_files: int, expected: Any) -> None:
    """One split file against the manifest's ExpectedGGUF (per-file facts only)."""
    name = header.path.name
    if n_files > 1 or "split.count" in header.kv:
        split_no, split_count = header.kv.get("split.no"), header.kv.get("split.count")
        if not isinstance(split_no, int) or not isinstance(split_count, int):
            raise MalformedGGUF(f"{name}: split.no / split.count missing from a split set's file")
        if split_count != n_files:
            raise MalformedGGUF(f"{name}: split.count {split_count} but the set has {n_files} file(s)")
        if split_no != index:
            raise MalformedGGUF(f"{name}: split.no {split_no} but it is file {index} of the set")
    arch = header.architecture
    if index == 0 or arch is not None:
        if arch != expected.architecture:
            raise MalformedGGUF(
                f"{name}: architecture {arch!r}, the manifest expects {expected.architecture!r}"
            )
    if index == 0:
        blocks = header.arch_value("block_count")
        if blocks != expected.block_count:
            raise MalformedGGUF(
                f"{name}: block_count {blocks!r}, the manifest expects {expected.block_count}"
            )
        for key, want in dict(expected.kv).items():
            got = header.kv.get(key)
            if got != want and not (
                isinstance(got, float) and isinstance(want, int | float) and abs(got - want) < 1e-6
            ):
                raise MalformedGGUF(f"{name}: {key} is {got!r}, the manifest expects {want!r}")
    if expected.tensor_counts is not None and len(header.tensors) != expected.tensor_counts[index]:
        raise MalformedGGUF(
            f"{name}: {len(header.tensors)} tensors, the manifest expects {expected.tensor_counts[index]}"
        )


def check_set(headers: Sequence[Header], expected: Any) -> None:
    """All split files together: every shard present, tensor totals consistent."""
    if not headers:
        raise MalformedGGUF("the set has no files")
    count = headers[0].kv.get("split.count", 1)
    if not isinstance(count, int) or count < 1:
        raise MalformedGGUF(f"{headers[0].path.name}: split.count {count!r} is not a positive integer")
    present = [h.kv.get("split.no", 0) for h in headers]
    missing = [k for k in range(count) if k not in present]
    if missing and len(headers) != count:
        raise MalformedGGUF(
            f"missing shard: split {missing[0] + 1} of {count} is not in the set "
            f"(have {len(headers)} file(s))"
        )
    if expected.split_count is not None and count != expected.split_count:
        raise MalformedGGUF(f"split.count {count}, the manifest expects {expected.split_count}")
    for i, h in enumerate(headers):
        check_file(h, i, len(headers), expected)
    if missing:
        raise MalformedGGUF(f"missing shard: split {missing[0] + 1} of {count} is not in the set")
    total = sum(len(h.tensors) for h in headers)
    declared = headers[0].kv.get("split.tensors.count")
    if declared is not None and declared != total:
        raise MalformedGGUF(
            f"split.tensors.count {declared} but the {len(headers)} file(s) hold {total} tensors"
        )
    names: set[str] = set()
    for h in headers:
        for t in h.tensors:
            if t.name in names:
                raise MalformedGGUF(f"tensor {t.name!r} appears in more than one split file")
            names.add(t.name)
