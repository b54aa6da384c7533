"""Build small GGUF files byte by byte (valid ones, and hostile ones), independent of gguf-py.

Used by the header-reader tests (each malformed case is a few bytes edited from a valid file) and to
make split sets of any size for the provisioning tests and the benchmark.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fetch.seal import hash_file

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
ALIGN = 32


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, value: Any) -> bytes:
    out = s(key) + struct.pack("<I", vtype)
    if vtype == STRING:
        return out + s(value)
    fmt = {U8: "<B", U16: "<H", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q"}[vtype]
    return out + struct.pack(fmt, value)


def kv_string_array(key: str, items: Sequence[str]) -> bytes:
    return s(key) + struct.pack("<IIQ", ARRAY, STRING, len(items)) + b"".join(s(i) for i in items)


def tensor_info(name: str, shape: Sequence[int], ggml_type: int, offset: int) -> bytes:
    out = s(name) + struct.pack("<I", len(shape))
    out += b"".join(struct.pack("<Q", d) for d in shape)
    return out + struct.pack("<IQ", ggml_type, offset)


def gguf_bytes(
    kvs: Sequence[bytes],
    tensors: Sequence[tuple[str, int]],
    *,
    version: int = 3,
    data: bytes | None = None,
    seed: int = 0,
) -> bytes:
    """A GGUF file with F32 1-D tensors of the given element counts and random data."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    offset = 0
    infos = b""
    for name, elements in tensors:
        infos += tensor_info(name, [elements], 0, offset)
        offset += -(-elements * 4 // ALIGN) * ALIGN
    head += infos
    head += b"\0" * (-len(head) % ALIGN)
    if data is None:
        data = np.random.default_rng(seed).bytes(offset)
    return head + data


def split_set(
    n_files: int, elements: Sequence[int], *, arch: str = "llama", blocks: int = 1, seed: int = 0
) -> list[bytes]:
    """``n_files`` split files, one F32 tensor each, llama-gguf-split style KV pairs."""
    files = []
    for i in range(n_files):
        kvs = []
        if i == 0:
            kvs += [kv("general.architecture", STRING, arch), kv(f"{arch}.block_count", U32, blocks)]
        if n_files > 1:
            kvs += [
                kv("split.no", U16, i),
                kv("split.count", U16, n_files),
                kv("split.tensors.count", I32, n_files),
            ]
        files.append(gguf_bytes(kvs, [(f"t{i}.weight", elements[i])], seed=seed + i))
    return files


def write_set(
    directory: Path,
    manifests: Path,
    set_name: str,
    blobs: Sequence[bytes],
    *,
    chunk_size: int,
    origins: list[dict[str, Any]],
    storage: str = "any",
    blocks: int = 1,
) -> list[dict[str, Any]]:
    """Write the files into ``directory`` and a *sealed* manifest (real hashes) into ``manifests``."""
    directory.mkdir(parents=True, exist_ok=True)
    manifests.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, blob in enumerate(blobs):
        name = f"{set_name}-{i + 1:05d}-of-{len(blobs):05d}.gguf"
        (directory / name).write_bytes(blob)
        entries.append({"name": name, **hash_file(directory / name, chunk_size)})
    data = {
        "schema_version": 1,
        "name": set_name,
        "description": "test set",
        "storage": storage,
        "origins": origins,
        "default_variant": "v",
        "variants": {
            "v": {
                "chunk_size": chunk_size,
                "chunk_digest": "blake3",
                "gguf": {
                    "architecture": "llama",
                    "block_count": blocks,
                    "split_count": len(blobs),
                    "tensor_counts": [1] * len(blobs),
                },
                "files": entries,
            }
        },
    }
    (manifests / f"{set_name}.json").write_text(json.dumps(data, indent=1))
    return entries
