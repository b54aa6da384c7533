"""core.hashing, the one file hasher: its digests equal hashlib's and blake3's reference values, and
every caller that hashes files (seal, the ledger, certificate subjects and verify, sha256_file) gets
exactly those values."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from certify import certificate as cert
from core import hashing
from core.canonical import sha256_file
from core.hashing import digest_fd, digest_file
from fetch import ledger
from fetch.seal import hash_file

CHUNK = 1 << 20

# 0 bytes, 1 byte, one byte either side of a chunk boundary, exactly one chunk, and several MiB that
# span more than one slice (SLICE is shrunk below so the multi-slice path runs on a few MiB).
SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 12345]


def _reference(data: bytes, chunk_size: int) -> dict[str, object]:
    return {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "blake3": blake3.blake3(data).hexdigest(),
        "chunks": [
            blake3.blake3(data[i : i + chunk_size]).hexdigest() for i in range(0, len(data), chunk_size)
        ],
    }


@pytest.fixture(params=SIZES, ids=lambda n: f"{n}B")
def sample(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(request.param)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return path, data


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    # Slices of 2 MiB: the multi-MiB sample crosses slice boundaries (the default is 64 MiB).
    monkeypatch.setattr(hashing, "SLICE", 2 * CHUNK)


def test_empty_file_gives_the_published_vectors(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    got = digest_file(tmp_path / "empty", sha256=True, blake3=True, chunk_size=CHUNK)
    assert got.sha256 == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert got.blake3 == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert (got.size, got.chunks) == (0, ())


@pytest.mark.parametrize("chunk_size", [CHUNK, 4096, 3 * CHUNK])
def test_digest_file_equals_reference(sample: tuple[Path, bytes], chunk_size: int) -> None:
    path, data = sample
    ref = _reference(data, chunk_size)
    got = digest_file(path, sha256=True, blake3=True, chunk_size=chunk_size)
    assert (got.size, got.sha256, got.blake3, list(got.chunks or ())) == (
        ref["size"],
        ref["sha256"],
        ref["blake3"],
        ref["chunks"],
    )


def test_every_caller_gets_the_reference(sample: tuple[Path, bytes]) -> None:
    path, data = sample
    ref = _reference(data, CHUNK)
    assert hash_file(path, CHUNK) == ref
    assert cert.file_digests(path) == {"sha256": ref["sha256"], "blake3": ref["blake3"]}
    assert sha256_file(path) == ref["sha256"]
    assert ledger.blake3_file(path) == ref["blake3"]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert ledger.blake3_fd(fd) == ref["blake3"]
    finally:
        os.close(fd)
    for start in range(0, len(data), CHUNK):
        piece = data[start : start + CHUNK]
        assert ledger.chunk_digest(piece) == blake3.blake3(piece).hexdigest()


def test_only_what_is_asked(sample: tuple[Path, bytes]) -> None:
    path, data = sample
    got = digest_file(path, sha256=True, blake3=False)
    assert (got.sha256, got.blake3, got.chunks) == (hashlib.sha256(data).hexdigest(), None, None)
    got = digest_file(path)
    assert (got.sha256, got.blake3) == (None, blake3.blake3(data).hexdigest())


def test_progress_counts_every_byte_once(sample: tuple[Path, bytes]) -> None:
    path, data = sample
    seen: list[int] = []
    digest_file(path, sha256=True, blake3=True, chunk_size=CHUNK, on_bytes=seen.append)
    assert sum(seen) == len(data)
    assert all(n > 0 for n in seen)


def test_descriptor_is_hashed_from_byte_zero(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(3 * CHUNK + 7)
    path.write_bytes(data)
    with open(path, "rb") as fh:
        fh.seek(12345)
        got = digest_fd(fh.fileno(), sha256=True, blake3=True)
    assert (got.sha256, got.blake3) == (hashlib.sha256(data).hexdigest(), blake3.blake3(data).hexdigest())


def test_bad_chunk_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="chunk_size"):
        digest_file(tmp_path / "f", chunk_size=0)


def test_a_pipe_is_refused_not_hashed_as_empty(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            digest_fd(fd, sha256=True)
    finally:
        os.close(fd)


def test_sha256_works_without_blake3(tmp_path: Path) -> None:
    """The device script runs core.canonical.sha256_file on a bare Python before blake3 is installed."""
    (tmp_path / "f").write_bytes(b"abc")
    code = (
        "import sys; sys.modules['blake3'] = None\n"  # any `import blake3` now raises ImportError
        "from core.canonical import sha256_file\n"
        f"print(sha256_file({str(tmp_path / 'f')!r}))"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == hashlib.sha256(b"abc").hexdigest()
