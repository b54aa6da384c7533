"""Fill a partial file from an origin, chunk by chunk, verifying every chunk as it lands.

HTTP(S) uses http.client directly (no third-party client) so that every rule below is ours to test:
- Range requests aligned to chunks, one request per run of missing chunks, ``If-Range`` with the
  strong ETag (or Last-Modified) seen before.
- 200 to a Range request: the body starts at byte 0, so it is consumed from chunk 0 ("restart from
  zero"); it is never written at the requested offset.
- 206: ``Content-Range`` must start where asked and report the manifest size, else the response is
  rejected.  A total or body longer than the manifest stops at the expected length: "unexpected size".
- Connection closed early, resets, timeouts, 5xx, 408 and 429 are transient: retried with capped
  exponential backoff while progress is being made, waiting at least what ``Retry-After`` asks (up to
  ``max_retry_after_s``); other 4xx never (401/403 say they are about access, not the URL).  Giving
  up says "incomplete N of M bytes" and the verified chunks stay for the next run.
- A chunk whose digest is wrong is not written; only that chunk is asked for again, a bounded number
  of times, then an integrity error names its offset.
- Redirects: at most ``max_redirects`` hops, same scheme, to the origin's host or a host the manifest
  allows; anything else is refused.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import logging
import os
import re
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import IntegrityError, RuntimeFailure
from fetch.ledger import Partial, open_nofollow
from manifests.artifact_sets import Origin

log = logging.getLogger("dgr.fetch")

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    attempts: int = 6  # transient failures in a row (without a verified chunk between) before giving up
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    chunk_attempts: int = 3  # a chunk failing its digest this often is an integrity error
    timeout_s: float = 60.0
    max_redirects: int = 5
    max_retry_after_s: float = 300.0  # the longest Retry-After we wait for (a longer one is capped)

    def delay(self, failures: int) -> float:
        return min(self.backoff_s * (2 ** max(failures - 1, 0)), self.max_backoff_s)


@dataclass
class Stats:
    bytes_received: int = 0
    requests: int = 0
    transient_failures: int = 0
    restarts_from_zero: int = 0
    chunk_failures: dict[int, int] = field(default_factory=dict)


class Transient(Exception):
    """A failure worth retrying: the next attempt may well succeed (not before ``retry_after`` s)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


_TRANSIENT_STATUS = (408, 429)  # Request Timeout, Too Many Requests: the server asks us to come back
_ACCESS_STATUS = (401, 403)


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


_TRANSIENT_ERRORS = (
    ConnectionError,
    TimeoutError,
    socket.timeout,
    http.client.IncompleteRead,
    http.client.HTTPException,
    ssl.SSLError,
)


def file_url(base_url: str, name: str) -> str:
    return base_url.rstrip("/") + "/" + urllib.parse.quote(name)


def _host_allowed(target: urllib.parse.SplitResult, base: urllib.parse.SplitResult, origin: Origin) -> bool:
    if target.scheme != base.scheme:
        return False
    if target.netloc.lower() == base.netloc.lower():
        return True
    allowed = {h.lower() for h in origin.allowed_redirect_hosts}
    host = (target.hostname or "").lower()
    return target.netloc.lower() in allowed or host in allowed


def _connect(url: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    if url.scheme == "https":
        return http.client.HTTPSConnection(
            url.hostname or "", url.port, timeout=timeout, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)


def open_url(
    url: str, origin: Origin, headers: dict[str, str], policy: RetryPolicy, stats: Stats
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """GET with our redirect rules; returns the open connection and the final response."""
    base = urllib.parse.urlsplit(origin.base_url or url)
    current = urllib.parse.urlsplit(url)
    for _hop in range(policy.max_redirects + 1):
        conn = _connect(current, policy.timeout_s)
        path = current.path or "/"
        if current.query:
            path += "?" + current.query
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
        except ssl.SSLCertVerificationError as exc:  # not transient: the peer is not who it claims
            conn.close()
            raise IntegrityError(
                f"{urllib.parse.urlunsplit(current)}: TLS certificate not trusted: {exc}"
            ) from None
        except (*_TRANSIENT_ERRORS, OSError) as exc:  # refused, unreachable, name lookup failed, reset
            conn.close()
            raise Transient(f"{urllib.parse.urlunsplit(current)}: {exc.__class__.__name__}: {exc}") from None
        stats.requests += 1
        if resp.status not in _REDIRECTS:
            return conn, resp
        location = resp.getheader("Location") or ""
        resp.close()
        conn.close()
        target = urllib.parse.urlsplit(urllib.parse.urljoin(urllib.parse.urlunsplit(current), location))
        if not _host_allowed(target, base, origin):
            raise IntegrityError(
                f"refused redirect from {urllib.parse.urlunsplit(current)} to "
                f"{urllib.parse.urlunsplit(target)}: another scheme or a host the manifest does not allow",
                hint="add the host to the origin's allowed_redirect_hosts if it is trusted",
            )
        current = target
    raise IntegrityError(f"refused {url}: more than {policy.max_redirects} redirects")


def _validator(resp: http.client.HTTPResponse) -> dict[str, str]:
    etag = resp.getheader("ETag")
    if etag and not etag.startswith("W/"):
        return {"etag": etag}
    modified = resp.getheader("Last-Modified")
    return {"last_modified": modified} if modified else {}


def _read_exact(resp: http.client.HTTPResponse, view: memoryview, stats: Stats) -> None:
    got = 0
    try:
        while got < len(view):
            n = resp.readinto(view[got:])
            if not n:
                raise Transient("connection closed early")
            got += n
            stats.bytes_received += n
    except TimeoutError:
        raise Transient("the origin stopped sending (read timed out)") from None
    except _TRANSIENT_ERRORS as exc:
        raise Transient(f"connection closed early ({exc.__class__.__name__})") from None


class _ChunkFeed:
    """Accept chunks into the partial, count digest failures, report progress.

    A three-stage pipeline over a ring of three chunk buffers: the caller receives chunk k+2 while
    one thread hashes chunk k+1 and another writes chunk k (recv, blake3 and pwrite all release the
    GIL).  Hashing stays in chunk order (the whole-file hasher is fed there), writing too.
    """

    SLOTS = 3

    def __init__(self, partial: Partial, policy: RetryPolicy, stats: Stats, on_bytes: Callable[[int], None]):
        self.partial = partial
        self.policy = policy
        self.stats = stats
        self.on_bytes = on_bytes
        self.buffers = [memoryview(bytearray(partial.chunk_size)) for _ in range(self.SLOTS)]
        self.busy: list[Future[bool] | None] = [None] * self.SLOTS
        self.turn = 0
        self.hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dgr-hash")
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dgr-write")

    def next_buffer(self, length: int) -> memoryview:
        """The next buffer of the ring, once the job that last used it has finished."""
        self.turn = (self.turn + 1) % self.SLOTS
        job, self.busy[self.turn] = self.busy[self.turn], None
        if job is not None:
            job.result()
        return self.buffers[self.turn][:length]

    def submit(self, index: int, view: memoryview) -> None:
        digest = self.hasher.submit(self.partial.check, index, view)
        self.busy[self.turn] = self.writer.submit(self._settle, index, view, digest)

    def drain(self) -> None:
        """Wait for every queued chunk; the first error (in chunk order) is raised."""
        order = [(self.turn + k) % self.SLOTS for k in range(1, self.SLOTS + 1)]  # oldest first
        jobs = [j for j in (self.busy[i] for i in order) if j is not None]
        self.busy = [None] * self.SLOTS
        error: BaseException | None = None
        for job in jobs:
            try:
                job.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below once all jobs are done
                error = error or exc
        if error is not None:
            raise error

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self.hasher.shutdown(wait=True)
            self.writer.shutdown(wait=True)

    def __enter__(self) -> _ChunkFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            try:
                self.close()
            except Exception:  # the error already in flight is the one worth reporting
                pass

    def _settle(self, index: int, view: memoryview, digest: Future[str]) -> bool:
        got = digest.result()
        assert self.partial.entry.chunks is not None
        if got == self.partial.entry.chunks[index]:
            self.partial.commit(index, view)
            self.on_bytes(len(view))
            return True
        if index in self.partial.verified:
            return True  # a bad copy of a chunk we already hold (a 200 body re-sent it): ours stays
        fails = self.stats.chunk_failures.get(index, 0) + 1
        self.stats.chunk_failures[index] = fails
        start, end = self.partial.span(index)
        log.warning(
            "%s: chunk %d (bytes %d-%d) failed verification", self.partial.entry.name, index, start, end
        )
        if fails >= self.policy.chunk_attempts:
            raise IntegrityError(
                f"{self.partial.entry.name}: chunk {index} at offset {start} (bytes {start}-{end - 1}) "
                f"failed verification {fails} times: expected blake3 {self.partial.entry.chunks[index]}, "
                f"got {got}",
                hint="the origin does not serve the sealed bytes; try another origin or re-seal deliberately",
            )
        return False


def fetch_http(
    origin: Origin,
    partial: Partial,
    *,
    policy: RetryPolicy,
    stats: Stats,
    on_bytes: Callable[[int], None] = lambda n: None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Fill every missing chunk of ``partial`` from ``origin`` or raise a typed error."""
    assert origin.base_url is not None
    url = file_url(origin.base_url, partial.entry.name)
    with _ChunkFeed(partial, policy, stats, on_bytes) as feed:
        _fetch_all(url, origin, partial, feed, policy, stats, sleep)


def _fetch_all(
    url: str,
    origin: Origin,
    partial: Partial,
    feed: _ChunkFeed,
    policy: RetryPolicy,
    stats: Stats,
    sleep: Callable[[float], None],
) -> None:
    failures = 0
    while missing := partial.missing():
        first = missing[0]
        last = first
        while last + 1 < partial.n_chunks and last + 1 not in partial.verified:  # a set: no list scan
            last += 1
        before = len(partial.verified)
        try:
            _fetch_span(url, origin, feed, first, last)
        except Transient as exc:
            feed.drain()  # the chunk received before the failure still counts as progress
            stats.transient_failures += 1
            failures = 0 if len(partial.verified) > before else failures + 1
            if failures >= policy.attempts:
                have = partial.bytes_verified
                raise RuntimeFailure(
                    f"{partial.entry.name}: incomplete {have} of {partial.size} bytes after {failures} "
                    f"failed attempts ({exc})",
                    hint="run the same command again to resume from the last verified chunk",
                ) from None
            wait = max(policy.delay(failures), min(exc.retry_after or 0.0, policy.max_retry_after_s))
            log.warning("%s: %s; retrying in %.1f s", partial.entry.name, exc, wait)
            sleep(wait)
            continue
        failures = 0


def _fetch_span(url: str, origin: Origin, feed: _ChunkFeed, first: int, last: int) -> None:
    partial, stats = feed.partial, feed.stats
    start = partial.span(first)[0]
    end = partial.span(last)[1]  # exclusive
    headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    if partial.validator and (partial.verified or start > 0):
        headers["If-Range"] = partial.validator.get("etag") or partial.validator.get("last_modified", "")
    conn, resp = open_url(url, origin, headers, feed.policy, stats)
    try:
        if resp.status >= 500 or resp.status in _TRANSIENT_STATUS:
            raise Transient(f"{url}: HTTP {resp.status} {resp.reason}",
                            retry_after=retry_after(resp.getheader("Retry-After")))
        if resp.status in _ACCESS_STATUS:
            raise RuntimeFailure(
                f"{url}: HTTP {resp.status} {resp.reason}: the origin refuses access (not retried)",
                hint="the URL answered, so this is about credentials or access rights: check that this "
                "machine may read that origin, or use another origin",
            )
        if resp.status == 200:
            if "If-Range" in headers and _validator(resp) != partial.validator:
                log.warning(
                    "%s: origin content changed (validator); restarting from zero", partial.entry.name
                )
            stats.restarts_from_zero += 1
            partial.set_validator(_validator(resp))
            _consume(resp, feed, 0, partial.n_chunks - 1, url, whole_body=True)
            return
        if resp.status == 206:
            got_start, got_end = _check_content_range(resp, url, start, end, partial.size)
            partial.set_validator(_validator(resp))
            # A server may send a shorter range than asked; whole chunks inside it are still usable.
            last_whole = last
            while last_whole >= first and partial.span(last_whole)[1] > got_end:
                last_whole -= 1
            if last_whole < first:
                raise Transient(
                    f"{url}: the origin sent bytes {got_start}-{got_end - 1}, less than one chunk"
                )
            _consume(resp, feed, first, last_whole, url, whole_body=False)
            return
        raise RuntimeFailure(
            f"{url}: HTTP {resp.status} {resp.reason} (not retried)",
            hint="check the origin URL in the artifact-set manifest",
        )
    finally:
        resp.close()
        conn.close()


def _check_content_range(
    resp: http.client.HTTPResponse, url: str, start: int, end: int, size: int
) -> tuple[int, int]:
    raw = (resp.getheader("Content-Range") or "").strip()
    match = _CONTENT_RANGE.match(raw)
    if not match:
        raise IntegrityError(
            f"{url}: rejected 206 response with Content-Range {raw!r} (asked bytes {start}-{end - 1})"
        )
    got_start, got_last, total = int(match[1]), int(match[2]), match[3]
    if total != "*" and int(total) != size:
        raise IntegrityError(
            f"{url}: unexpected size: Content-Range {raw!r} reports {total} bytes, the manifest says {size}"
        )
    if total == "*" or got_start != start or got_last < got_start or got_last > end - 1:
        raise IntegrityError(
            f"{url}: rejected 206 response: Content-Range {raw!r} does not match the "
            f"requested bytes {start}-{end - 1} of {size}"
        )
    length = resp.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) != got_last - got_start + 1:
        raise IntegrityError(f"{url}: rejected 206 response: Content-Length {length} disagrees with {raw!r}")
    return got_start, got_last + 1


def _consume(
    resp: http.client.HTTPResponse, feed: _ChunkFeed, first: int, last: int, url: str, *, whole_body: bool
) -> None:
    partial = feed.partial
    if whole_body:
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) < partial.size:
            raise IntegrityError(
                f"{url}: unexpected size: the origin sends {length} bytes, the manifest says {partial.size}"
            )
    for index in range(first, last + 1):
        a, b = partial.span(index)
        piece = feed.next_buffer(b - a)
        _read_exact(resp, piece, feed.stats)
        feed.submit(index, piece)  # a 200 body restarts from zero: verified chunks are only re-hashed
    feed.drain()
    if whole_body:
        try:
            extra = resp.read(1)
        except _TRANSIENT_ERRORS:
            extra = b""
        if extra:
            raise IntegrityError(
                f"{url}: unexpected size: the origin sends more than the manifest's "
                f"{partial.size} bytes; stopped at the expected length"
            )


def copy_local(
    directory: Path,
    partial: Partial,
    *,
    policy: RetryPolicy,
    stats: Stats,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> None:
    """A local-directory origin: the same chunk verification, reading instead of downloading."""
    src = directory / partial.entry.name
    try:
        fd = open_nofollow(src, os.O_RDONLY)
    except FileNotFoundError:
        raise RuntimeFailure(f"{src} does not exist (local origin)") from None
    try:
        size = os.fstat(fd).st_size
        if size != partial.size:
            raise IntegrityError(f"{src}: unexpected size: {size} bytes, the manifest says {partial.size}")
        with _ChunkFeed(partial, dataclasses.replace(policy, chunk_attempts=1), stats, on_bytes) as feed:
            for index in partial.missing():
                a, b = partial.span(index)
                piece = feed.next_buffer(b - a)
                n = os.preadv(fd, [piece], a)
                if n != b - a:
                    raise RuntimeFailure(f"{src}: short read at byte {a}")
                stats.bytes_received += n
                feed.submit(index, piece)
    finally:
        os.close(fd)
