"""The one file hasher: sha256 and/or blake3 (and optionally one blake3 per chunk) in a single read.

Provisioning (``fetch.ledger``), sealing (``fetch.seal``), certificate subjects and ``dgr verify``
(``certify.certificate.file_digests``) and ``core.canonical.sha256_file`` all hash files here, so a
digest means the same bytes everywhere and every caller gets the fast path:

- the file is mapped (``mmap``) and fed in large slices, so nothing is copied out of the page cache;
- blake3 runs multi-threaded (``max_threads=AUTO``) on each slice;
- when both digests are wanted, sha256 (inherently sequential; hashlib releases the GIL on large
  buffers) runs on a helper thread, one slice behind at most, so it overlaps blake3 instead of adding
  to it;
- ``on_bytes`` is called after each slice, for progress.

The size hashed is the size ``fstat`` reports when hashing starts: every caller hashes a file nobody is
writing (a published store file, a partial fixed at its manifest size, a file being sealed or verified).
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from hashlib import sha256 as _Sha256
from pathlib import Path
from typing import Any

SLICE = 64 << 20  # bytes per update: big enough to keep blake3's threads busy, small enough for progress
CHUNK_THREADS_MIN = 1 << 20  # a chunk this large is hashed with blake3's threads; smaller is not worth it


@dataclass(frozen=True, kw_only=True)
class FileDigests:
    """What ``digest_fd`` computed: the size, and each digest asked for (None when not asked)."""

    size: int
    sha256: str | None = None
    blake3: str | None = None
    chunks: tuple[str, ...] | None = None


def _blake3() -> Any:
    """blake3's hasher class, imported on first use: sha256 alone must work without blake3 (the device
    script checks its bundle with core.canonical.sha256_file on a bare Python, before the wheels that
    bring blake3 are installed)."""
    from blake3 import blake3  # noqa: PLC0415

    return blake3


def chunk_digest(data: bytes | memoryview) -> str:
    """The blake3 of one chunk, as sealed into manifests and checked by provisioning."""
    hasher = _blake3()
    threads = hasher.AUTO if len(data) >= CHUNK_THREADS_MIN else 1
    return hasher(data, max_threads=threads).hexdigest()


def digest_file(
    path: Path | str,
    *,
    sha256: bool = False,
    blake3: bool = True,
    chunk_size: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> FileDigests:
    """``digest_fd`` on ``path`` (opened read-only; a caller that must refuse links opens it itself)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return digest_fd(fd, sha256=sha256, blake3=blake3, chunk_size=chunk_size, on_bytes=on_bytes)
    finally:
        os.close(fd)


def digest_fd(
    fd: int,
    *,
    sha256: bool = False,
    blake3: bool = True,
    chunk_size: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> FileDigests:
    """Hash the open file ``fd`` from byte 0 to its current size in one pass over an mmap.

    ``sha256`` / ``blake3``: which whole-file digests to compute.  ``chunk_size``: also the blake3 of
    every ``chunk_size`` bytes (the last chunk may be shorter; an empty file has no chunks).
    """
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        # A pipe or device reports size 0 (or none): hashing "its size" would be a silent wrong digest.
        raise OSError(errno.EINVAL, "not a regular file; refusing to hash it")
    size = st.st_size
    sha = _Sha256() if sha256 else None
    whole = None
    if blake3:
        hasher = _blake3()
        whole = hasher(max_threads=hasher.AUTO)
    chunks: list[str] | None = [] if chunk_size is not None else None
    step = SLICE if chunk_size is None else max(1, SLICE // chunk_size) * chunk_size
    if size:
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mm:
            view = memoryview(mm)
            # sha256 on a helper thread only when there is blake3 work to overlap it with.
            overlap = sha is not None and (whole is not None or chunks is not None)
            helper = ThreadPoolExecutor(1, thread_name_prefix="dgr-sha256") if overlap else None
            pending: list[tuple[Future[None], memoryview]] = []
            try:
                for start in range(0, size, step):
                    piece = view[start : start + step]
                    if sha is not None:
                        if helper is not None:
                            pending.append((helper.submit(sha.update, piece), piece))
                        else:
                            sha.update(piece)
                    if whole is not None:
                        whole.update(piece)
                    if chunks is not None and chunk_size is not None:
                        for at in range(0, len(piece), chunk_size):
                            sub = piece[at : at + chunk_size]
                            chunks.append(chunk_digest(sub))
                            sub.release()
                    if on_bytes:
                        on_bytes(len(piece))
                    if helper is None:
                        piece.release()
                    else:
                        # Keep at most one slice in flight: the helper lags blake3 by a slice, no more.
                        while len(pending) > 1:
                            done, held = pending.pop(0)
                            done.result()
                            held.release()
            finally:
                for done, held in pending:
                    done.result()
                    held.release()
                if helper is not None:
                    helper.shutdown()
                view.release()
    return FileDigests(
        size=size,
        sha256=sha.hexdigest() if sha is not None else None,
        blake3=whole.hexdigest() if whole is not None else None,
        chunks=tuple(chunks) if chunks is not None else None,
    )
