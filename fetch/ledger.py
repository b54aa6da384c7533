"""What is already verified: the chunk ledger of a partial file, and the stat-identity sidecar of a set.

Partial file.  ``.<name>.part`` beside the destination is created at its final size (sparse) and only
ever receives *verified* chunks: a chunk is buffered, hashed against the manifest and only then written
at its offset.  So every byte ever written into a partial is the sealed byte for that offset, which is
what keeps two runs correct when the per-file lock does nothing (a network filesystem): they may share
the inode, but they can only write identical bytes into it, and publishing is an atomic rename of a
file whose whole-file digest was just checked.

Ledger.  ``.<name>.ledger`` records each verified chunk as one appended line (``index digest``): a
small ``O_APPEND`` write is atomic, survives ``kill -9`` through the page cache, and a torn last line
is ignored.  The ledger is a claim, not a proof: on resume every claimed chunk is hashed again before
it is trusted (cheap next to a download), so a power cut that lost page-cache data costs a refetch,
never a bad byte.  Data and ledger are fsync'd every few seconds and before publishing.

Sidecar.  ``.dgr-verified.json`` in the variant directory keeps, per published file, its stat identity
(size, mtime_ns, ctime_ns, inode, device) and digests, plus the manifest digest.  A re-run trusts a file
whose identity is unchanged (a stat), and re-hashes when anything differs or the sidecar is corrupt,
stale or from another manifest.
"""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from core import errors
from core.canonical import atomic_write_bytes, canonical_bytes, parse_json
from core.errors import DISK_FULL_ERRNOS, IntegrityError
from core.hashing import chunk_digest, digest_fd
from manifests.artifact_sets import ArtifactFile

LEDGER_VERSION = 1
SIDECAR = ".dgr-verified.json"
SIDECAR_VERSION = 1
SYNC_EVERY_S = 2.0


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """RELIABILITY 14: never open through a link planted in the store."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IntegrityError(
                f"{path} is a symbolic link; refusing to use it", hint="remove the link and retry"
            ) from None
        raise


def blake3_file(path: Path, *, on_bytes: Callable[[int], None] | None = None) -> str:
    """Whole-file blake3 (core.hashing: mmap, multi-threaded; progress between slices); no links."""
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        return blake3_fd(fd, on_bytes=on_bytes)
    finally:
        os.close(fd)


def blake3_fd(fd: int, *, on_bytes: Callable[[int], None] | None = None) -> str:
    """As blake3_file, on an open descriptor (a partial another run may rename away meanwhile)."""
    digest = digest_fd(fd, blake3=True, on_bytes=on_bytes).blake3
    assert digest is not None
    return digest


# --- ledger ------------------------------------------------------------------------------------------


@dataclass
class Partial:
    """A partial file and its ledger; ``verified`` holds chunk indices whose bytes were hashed."""

    path: Path
    ledger_path: Path
    entry: ArtifactFile
    chunk_size: int
    fd: int
    ledger_fd: int
    verified: set[int]
    validator: dict[str, str]
    identity: str
    whole: Any = None  # blake3 hasher fed in chunk order (see feed_whole)
    whole_next: int = 0
    _last_sync: float = 0.0

    @property
    def n_chunks(self) -> int:
        assert self.entry.size is not None
        return -(-self.entry.size // self.chunk_size)

    @property
    def size(self) -> int:
        assert self.entry.size is not None
        return self.entry.size

    def missing(self) -> list[int]:
        return [i for i in range(self.n_chunks) if i not in self.verified]

    @property
    def bytes_verified(self) -> int:
        return sum(self.span(i)[1] - self.span(i)[0] for i in self.verified)

    def span(self, index: int) -> tuple[int, int]:
        return self.entry.chunk_span(index, self.chunk_size)

    def check(self, index: int, data: memoryview | bytes) -> str:
        """The chunk's blake3; a right one also feeds the whole-file hasher (call in chunk order)."""
        assert self.entry.chunks is not None
        start, end = self.span(index)
        if len(data) != end - start:
            raise AssertionError(f"chunk {index}: {len(data)} bytes for span {start}:{end}")
        got = chunk_digest(data)
        if got == self.entry.chunks[index]:
            self.feed_whole(index, data)
        return got

    def commit(self, index: int, data: memoryview | bytes) -> None:
        """Write a chunk ``check`` found right, then record it; a chunk we hold is not written again."""
        if index in self.verified:
            return
        assert self.entry.chunks is not None
        pwrite_all(self.fd, data, self.span(index)[0], self.path)
        _append(self.ledger_fd, f"{index} {self.entry.chunks[index]}\n".encode())
        self.verified.add(index)
        self.maybe_sync()

    def feed_whole(self, index: int, data: memoryview | bytes) -> None:
        """The whole-file blake3, built as verified chunks pass in order from chunk 0.

        A fresh download sees every chunk in order, so the whole-file check costs no second read;
        after a gap (a resume, a refetched chunk) ``whole_digest`` is None and the caller re-reads.
        """
        if index == self.whole_next:
            self.whole.update(data)
            self.whole_next += 1

    def whole_digest(self) -> str | None:
        return self.whole.hexdigest() if self.whole_next == self.n_chunks else None

    def set_validator(self, validator: dict[str, str]) -> None:
        """The origin's ETag/Last-Modified for If-Range; a change rewrites the ledger header atomically."""
        if validator == self.validator:
            return
        self.validator = dict(validator)
        _write_ledger(self.ledger_path, self.identity, self.validator, self.entry, self.verified)
        os.close(self.ledger_fd)
        self.ledger_fd = open_nofollow(self.ledger_path, os.O_WRONLY | os.O_APPEND)

    def maybe_sync(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_sync >= SYNC_EVERY_S:
            os.fdatasync(self.fd)
            os.fsync(self.ledger_fd)
            self._last_sync = now

    def close(self) -> None:
        for fd in (self.fd, self.ledger_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def discard_ledger(self) -> None:
        self.ledger_path.unlink(missing_ok=True)


def pwrite_all(fd: int, data: memoryview | bytes, offset: int, path: Path) -> None:
    """All of ``data`` at ``offset``; a full disk (ENOSPC, EDQUOT) is a DiskFull, for every writer of
    downloaded bytes (a partial here, a hub seal's staged file)."""
    view = memoryview(data)
    done = 0
    try:
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFull(path, offset + done) from None
        raise


class DiskFull(errors.DiskFull):
    """ENOSPC mid-write: stop at once; the partial and its ledger are kept for a later resume."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.offset = offset
        super().__init__(f"disk full writing {path} at byte {offset}")


def _append(fd: int, line: bytes) -> None:
    os.write(fd, line)


def _write_ledger(
    path: Path, identity: str, validator: dict[str, str], entry: ArtifactFile, verified: set[int]
) -> None:
    """A whole ledger (header + one line per verified chunk), replaced atomically."""
    assert entry.chunks is not None
    lines = [json.dumps({"ledger": LEDGER_VERSION, "identity": identity, "validator": validator}) + "\n"]
    lines += [f"{i} {entry.chunks[i]}\n" for i in sorted(verified)]
    atomic_write_bytes(path, "".join(lines).encode())


def open_partial(
    dest: Path, entry: ArtifactFile, chunk_size: int, *, on_rehash: Callable[[int], None] | None = None
) -> Partial:
    """Open (or create) ``.<name>.part`` + ``.<name>.ledger`` beside ``dest`` and re-verify claims."""
    assert entry.size is not None and entry.chunks is not None
    part = dest.with_name(f".{dest.name}.part")
    ledger = dest.with_name(f".{dest.name}.ledger")
    identity = entry.identity(chunk_size)
    fd = open_nofollow(part, os.O_RDWR | os.O_CREAT)
    try:
        st = os.fstat(fd)
        # Sparse at the manifest size.  A sharer under the same manifest has the same size; a larger
        # leftover is from another seal of this name (its ledger is discarded, its tail must go too).
        if st.st_size != entry.size:
            os.ftruncate(fd, entry.size)
        claims, validator = _read_ledger(ledger, identity, entry)
        whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
        verified, whole_next = _recheck(fd, entry, chunk_size, claims, on_rehash, whole)
        if claims is None:  # absent, corrupt or for another file: start it afresh
            _write_ledger(ledger, identity, validator, entry, verified)
        lfd = open_nofollow(ledger, os.O_WRONLY | os.O_APPEND)
    except BaseException:
        os.close(fd)
        raise
    return Partial(
        path=part,
        ledger_path=ledger,
        entry=entry,
        chunk_size=chunk_size,
        fd=fd,
        ledger_fd=lfd,
        verified=verified,
        validator=validator,
        identity=identity,
        whole=whole,
        whole_next=whole_next,
        _last_sync=time.monotonic(),
    )


def _read_ledger(path: Path, identity: str, entry: ArtifactFile) -> tuple[set[int] | None, dict[str, str]]:
    """Claimed chunk indices, or None when the ledger is absent, corrupt or for another file."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, {}
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(64 << 20)
    lines = raw.split(b"\n")
    try:
        header = parse_json(lines[0], source=str(path))
    except ValueError:
        return None, {}
    if (
        not isinstance(header, dict)
        or header.get("ledger") != LEDGER_VERSION
        or header.get("identity") != identity
    ):
        return None, {}
    named = header.get("validator")
    validator = named if isinstance(named, dict) else {}
    assert entry.chunks is not None
    claims: set[int] = set()
    for line in lines[1:]:
        parts = line.split(b" ")
        if len(parts) != 2 or not parts[0].isdigit():
            continue  # a torn last line after a crash
        index = int(parts[0])
        if index < len(entry.chunks) and parts[1].decode("ascii", "replace") == entry.chunks[index]:
            claims.add(index)
    return claims, {str(k): str(v) for k, v in validator.items()}


def _recheck(
    fd: int,
    entry: ArtifactFile,
    chunk_size: int,
    claims: set[int] | None,
    on_rehash: Callable[[int], None] | None,
    whole: Any,
) -> tuple[set[int], int]:
    """Claimed chunks whose bytes hash right, and how many leading chunks fed ``whole``."""
    assert entry.chunks is not None
    good: set[int] = set()
    whole_next = 0
    for index in sorted(claims or ()):
        start, end = entry.chunk_span(index, chunk_size)
        data = os.pread(fd, end - start, start)
        if len(data) == end - start and chunk_digest(data) == entry.chunks[index]:
            good.add(index)
            if index == whole_next:
                whole.update(data)
                whole_next += 1
        if on_rehash:
            on_rehash(end - start)
    return good, whole_next


# --- sidecar -----------------------------------------------------------------------------------------


def stat_identity(st: os.stat_result) -> dict[str, int]:
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "inode": st.st_ino,
        "dev": st.st_dev,
    }


@dataclass
class Sidecar:
    """Per-file records by name, and whether the split headers were checked together afterwards."""

    files: dict[str, dict[str, Any]]
    set_checked: bool = False


def read_sidecar(directory: Path, manifest_digest: str) -> Sidecar:
    """The sidecar, or an empty one when it is absent, corrupt or from another manifest."""
    path = directory / SIDECAR
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (FileNotFoundError, IntegrityError):
        return Sidecar(files={})
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(16 << 20)
    try:
        data = parse_json(raw, source=str(path))
    except ValueError:
        return Sidecar(files={})
    if (
        not isinstance(data, dict)
        or data.get("sidecar") != SIDECAR_VERSION
        or data.get("manifest") != manifest_digest
        or not isinstance(data.get("files"), dict)
    ):
        return Sidecar(files={})
    files = {k: v for k, v in data["files"].items() if isinstance(v, dict)}
    return Sidecar(files=files, set_checked=data.get("set_checked") is True)


def write_sidecar(directory: Path, manifest_digest: str, sidecar: Sidecar) -> None:
    """Atomic (temp + rename) but not fsync'd: the sidecar is a cache of hashing already done.

    After a power cut it may be missing, empty or old; each of those reads as "not trusted" and
    costs one re-hash, never a wrong answer, so paying an fsync per file on every run buys nothing.
    """
    data = canonical_bytes(
        {
            "sidecar": SIDECAR_VERSION,
            "manifest": manifest_digest,
            "files": sidecar.files,
            "set_checked": sidecar.set_checked,
        }
    )
    tmp = directory / f"{SIDECAR}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, directory / SIDECAR)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sidecar_record(path: Path, entry: ArtifactFile, chunk_size: int) -> dict[str, Any]:
    st = os.stat(path, follow_symlinks=False)
    return {
        **stat_identity(st),
        "identity": entry.identity(chunk_size),
        "sha256": entry.sha256,
        "blake3": entry.blake3,
    }


def sidecar_trusts(record: dict[str, Any] | None, path: Path, entry: ArtifactFile, chunk_size: int) -> bool:
    """A stat, not a hash: the file is what we verified iff its identity has not changed since."""
    if not record:
        return False
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (
        record.get("identity") == entry.identity(chunk_size)
        and all(record.get(k) == v for k, v in stat_identity(st).items())
        and st.st_size == entry.size
    )
