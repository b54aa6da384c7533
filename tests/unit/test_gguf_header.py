"""RELIABILITY 19: malformed GGUF headers are rejected by our bounded reader, each in bounded time."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest

from fetch.gguf_header import MalformedGGUF, check_set, read_header
from manifests.artifact_sets import ExpectedGGUF
from tests.unit.ggufmaker import ARRAY, STRING, U16, U32, gguf_bytes, kv, s, split_set, tensor_info

EXPECT = ExpectedGGUF(architecture="llama", block_count=1, split_count=3, tensor_counts=(1, 1, 1))


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def valid(tmp_path: Path) -> list[Path]:
    return [
        write(tmp_path, f"m-{i + 1:05d}-of-00003.gguf", b) for i, b in enumerate(split_set(3, [64, 96, 32]))
    ]


@pytest.mark.timeout(5)
def test_valid_split_set_reads_and_checks(tmp_path: Path) -> None:
    headers = [read_header(p) for p in valid(tmp_path)]
    check_set(headers, EXPECT)
    assert headers[0].architecture == "llama"
    assert [h.kv["split.no"] for h in headers] == [0, 1, 2]
    assert headers[1].tensors[0].nbytes == 96 * 4


def header_prefix(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


BAD_CASES = {
    "bad magic": (b"GGML" + b"\0" * 60, "bad magic"),
    "bad version": (header_prefix(0, 0, version=7), "unsupported version 7"),
    "absurd tensor count": (header_prefix(1 << 62, 0), "tensor count"),
    "absurd kv count": (header_prefix(0, 1 << 40), "KV count"),
    "absurd string length": (header_prefix(0, 1) + struct.pack("<Q", 1 << 60), "string length"),
    "string past EOF": (header_prefix(0, 1) + struct.pack("<Q", 4096) + b"abc", "past the end"),
    "absurd array length": (
        header_prefix(0, 1) + s("k") + struct.pack("<IIQ", ARRAY, U32, 1 << 50),
        "array length",
    ),
    "array of strings past EOF": (
        header_prefix(0, 1) + s("k") + struct.pack("<IIQ", ARRAY, STRING, 1 << 20),
        "cannot fit",
    ),
    "nested array": (
        header_prefix(0, 1) + s("k") + struct.pack("<IIQ", ARRAY, ARRAY, 1) + bytes(64),
        "array item",
    ),
    "unknown value type": (header_prefix(0, 1) + s("k") + struct.pack("<I", 99), "unknown value type"),
    "too many dims": (header_prefix(1, 0) + s("t") + struct.pack("<I", 9), "dimensions"),
    "unknown ggml type": (header_prefix(1, 0) + tensor_info("t", [32], 77, 0), "unknown ggml type"),
    "offset past EOF": (
        header_prefix(1, 0) + tensor_info("t", [32], 0, 1 << 40) + b"\0" * 64,
        "past the end",
    ),
    "misaligned offset": (header_prefix(1, 0) + tensor_info("t", [8], 0, 3) + b"\0" * 128, "not aligned"),
    "bad alignment": (header_prefix(0, 1) + kv("general.alignment", U32, 24), "alignment"),
    "truncated header": (header_prefix(0, 3) + kv("a", U32, 1), "past the end"),
}


@pytest.mark.timeout(5)
@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_malformed_header_rejected_in_bounded_time_and_memory(tmp_path: Path, case: str) -> None:
    data, message = BAD_CASES[case]
    path = write(tmp_path, "bad.gguf", data)
    tracemalloc.start()
    try:
        with pytest.raises(MalformedGGUF, match=message):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{case}: peak {peak} bytes"


@pytest.mark.timeout(5)
def test_overlapping_tensors_rejected(tmp_path: Path) -> None:
    head = header_prefix(2, 0) + tensor_info("a", [64], 0, 0) + tensor_info("b", [64], 0, 128)
    head += b"\0" * (-len(head) % 32) + b"\0" * 512
    with pytest.raises(MalformedGGUF, match="overlap"):
        read_header(write(tmp_path, "o.gguf", head))


@pytest.mark.timeout(5)
def test_inconsistent_split_no_rejected(tmp_path: Path) -> None:
    paths = valid(tmp_path)
    blobs = split_set(3, [64, 96, 32])
    # file 2 claims to be split 0
    kvs = [kv("split.no", U16, 0), kv("split.count", U16, 3), kv("split.tensors.count", 5, 3)]
    paths[1].write_bytes(gguf_bytes(kvs, [("t1.weight", 96)]))
    assert blobs
    with pytest.raises(MalformedGGUF, match="split.no 0 but it is file 1"):
        check_set([read_header(p) for p in paths], EXPECT)


@pytest.mark.timeout(5)
def test_inconsistent_split_count_rejected(tmp_path: Path) -> None:
    paths = valid(tmp_path)
    kvs = [kv("split.no", U16, 2), kv("split.count", U16, 4), kv("split.tensors.count", 5, 3)]
    paths[2].write_bytes(gguf_bytes(kvs, [("t2.weight", 32)]))
    with pytest.raises(MalformedGGUF, match="split.count 4 but the set has 3"):
        check_set([read_header(p) for p in paths], EXPECT)


@pytest.mark.timeout(5)
def test_wrong_split_tensor_total_rejected(tmp_path: Path) -> None:
    paths = valid(tmp_path)
    first = [
        kv("general.architecture", STRING, "llama"),
        kv("llama.block_count", U32, 1),
        kv("split.no", U16, 0),
        kv("split.count", U16, 3),
        kv("split.tensors.count", 5, 9),
    ]
    paths[0].write_bytes(gguf_bytes(first, [("t0.weight", 64)]))
    with pytest.raises(MalformedGGUF, match="split.tensors.count 9"):
        check_set([read_header(p) for p in paths], EXPECT)


@pytest.mark.timeout(5)
def test_missing_shard_rejected(tmp_path: Path) -> None:
    paths = valid(tmp_path)
    with pytest.raises(MalformedGGUF, match="missing shard: split 2 of 3"):
        check_set([read_header(paths[0]), read_header(paths[2])], EXPECT)


@pytest.mark.timeout(5)
def test_architecture_and_block_count_checked(tmp_path: Path) -> None:
    paths = valid(tmp_path)
    headers = [read_header(p) for p in paths]
    with pytest.raises(MalformedGGUF, match="architecture 'llama', the manifest expects 'deepseek4'"):
        check_set(headers, ExpectedGGUF(architecture="deepseek4", block_count=1))
    with pytest.raises(MalformedGGUF, match="block_count 1, the manifest expects 43"):
        check_set(headers, ExpectedGGUF(architecture="llama", block_count=43))
    with pytest.raises(MalformedGGUF, match="llama.embedding_length is None"):
        check_set(
            headers, ExpectedGGUF(architecture="llama", block_count=1, kv={"llama.embedding_length": 4096})
        )
