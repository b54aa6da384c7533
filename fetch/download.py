"""Fill a partial file from an origin, chunk by chunk, verifying every chunk as it lands.

HTTP(S) goes through ``requests`` (one Session per file: connections are reused from span to span;
``trust_env``: HTTPS_PROXY / HTTP_PROXY / NO_PROXY and REQUESTS_CA_BUNDLE are honoured) with urllib3's
Retry for the statuses a server uses to say "come back later", but every rule below stays ours:
- Range requests aligned to chunks, one request per run of missing chunks, ``If-Range`` with the
  strong ETag (or Last-Modified) seen before.
- 200 to a Range request: the body starts at byte 0, so it is consumed from chunk 0 ("restart from
  zero"); it is never written at the requested offset.
- 206: ``Content-Range`` must start where asked and report the manifest size, else the response is
  rejected.  A total or body longer than the manifest stops at the expected length: "unexpected size".
- 5xx, 408 and 429 are retried by urllib3 (``attempts - 1`` times per request), waiting what
  ``Retry-After`` asks (up to ``max_retry_after_s``) or the capped exponential backoff.  Connection
  closed early, resets and timeouts are retried here, while progress is being made.  Other 4xx never
  (401/403 say they are about access, not the URL).  Giving up says "incomplete N of M bytes" and the
  verified chunks stay for the next run.
- A chunk whose digest is wrong is not written; only that chunk is asked for again, a bounded number
  of times, then an integrity error names its offset.
- Redirects are followed here, not by requests: at most ``max_redirects`` hops, same scheme, to the
  origin's host or a host the manifest allows; anything else is refused.  A ``Credential`` goes only
  to the scheme, host and port it names (a hub's token never reaches its storage host, even one on
  the same address with another port).  No .netrc credentials are picked up.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
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
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import Retry

from core import redact
from core.digits import ascii_int
from core.errors import DgrError, IntegrityError, RuntimeFailure
from fetch.ledger import Partial, open_nofollow
from manifests.artifact_sets import Origin

log = redact.logger("dgr.fetch")
_Answer = TypeVar("_Answer")

_CONTENT_RANGE = re.compile(r"^bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)$")  # ASCII digits: int() takes them
_REDIRECTS = (301, 302, 303, 307, 308)
_REDIRECT_BODY_MAX = 1 << 16  # a redirect's body this small is read, so its connection is reused


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
    """A failure worth retrying: the next attempt may well succeed (not before ``retry_after`` s).
    ``exhausted``: urllib3 already retried it as often as the policy allows."""

    def __init__(self, message: str, *, retry_after: float | None = None, exhausted: bool = False) -> None:
        super().__init__(redact.scrub(message))  # logged while retrying: scrubbed like a DgrError
        self.retry_after = retry_after
        self.exhausted = exhausted


# Request Timeout, Too Many Requests, server errors: the server asks us to come back
_TRANSIENT_STATUS = frozenset({408, 429, *range(500, 600)})
_ACCESS_STATUS = (401, 403)


def header_int(value: str | None) -> int | None:
    """A header's number: ASCII digits only, else None (core.digits)."""
    return ascii_int(value)


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    seconds = header_int(value)
    if seconds is not None:
        return float(seconds)
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
    requests.RequestException,
    Urllib3Error,
)


class _StatusRetry(Retry):
    """urllib3's Retry, waiting what Retry-After asks on every status we retry (not only 413/429/503);
    an unreadable Retry-After falls back to the backoff instead of failing the request."""

    RETRY_AFTER_STATUS_CODES = _TRANSIENT_STATUS

    def parse_retry_after(self, retry_after: str) -> float:
        try:
            return super().parse_retry_after(retry_after)
        except InvalidHeader:
            return 0.0


class _NoNetrc(AuthBase):
    """Set as the Session's auth so requests does not add .netrc credentials to any request: the only
    credential we send is the one a ``Credential`` names, to the host it names."""

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        return r


def open_session(policy: RetryPolicy) -> requests.Session:
    """One Session per file: its connection pool is reused span after span (and hop after hop)."""
    session = requests.Session()
    session.trust_env = True  # proxies, NO_PROXY and CA bundles from the environment
    session.auth = _NoNetrc()
    retry = _StatusRetry(
        total=None,
        connect=0,  # connection failures and early closes are ours: counted against progress
        read=0,
        other=0,
        redirect=False,  # redirects are ours too (allow-list, credentials)
        status=max(policy.attempts - 1, 0),
        status_forcelist=_TRANSIENT_STATUS,
        allowed_methods=frozenset({"GET"}),
        backoff_factor=policy.backoff_s,
        backoff_max=policy.max_backoff_s,
        retry_after_max=int(policy.max_retry_after_s),
        respect_retry_after_header=True,
        raise_on_status=False,  # the last answer comes back; _fetch_span says what it was
    )
    adapter = HTTPAdapter(max_retries=retry, pool_connections=4, pool_maxsize=4)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _endpoint(url: urllib.parse.SplitResult) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, (url.hostname or "").lower(), url.port or default


@dataclass(frozen=True, kw_only=True)
class Credential:
    """An Authorization header for exactly one scheme://host:port (never shown in a repr or a log)."""

    url: str  # any URL on that endpoint
    header: str | None = field(default=None, repr=False)  # None: no credential, only ``refused``
    refused: Callable[[int], DgrError] | None = field(default=None, repr=False, compare=False)

    def applies(self, target: urllib.parse.SplitResult) -> bool:
        return _endpoint(target) == _endpoint(urllib.parse.urlsplit(self.url))


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


def _untrusted_tls(exc: BaseException) -> bool:
    """Is this (wrapped) TLS failure a certificate nobody vouches for, rather than a broken link?"""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        nested = seen.args[0] if seen.args and isinstance(seen.args[0], BaseException) else None
        seen = getattr(seen, "reason", None) or nested or seen.__cause__ or seen.__context__
    return False


def open_url(
    url: str,
    origin: Origin,
    headers: dict[str, str],
    policy: RetryPolicy,
    stats: Stats,
    *,
    session: requests.Session,
    credential: Credential | None = None,
    hops: list[dict[str, str]] | None = None,
) -> requests.Response:
    """GET with our redirect rules; returns the final (streaming) response.  ``hops`` receives the
    headers of each redirect answered on the way (a hub states a file's sha256 on its redirect)."""
    base = urllib.parse.urlsplit(origin.base_url or url)
    current = urllib.parse.urlsplit(url)
    for _hop in range(policy.max_redirects + 1):
        resp = _get_hop(current, headers, policy, session, credential)
        stats.requests += 1
        if resp.status_code not in _REDIRECTS:
            return resp
        if hops is not None:
            hops.append(dict(resp.headers))
        current = _redirect_target(resp, current, base, origin)
    raise IntegrityError(f"refused {url}: more than {policy.max_redirects} redirects")


def _get_hop(
    current: urllib.parse.SplitResult,
    headers: dict[str, str],
    policy: RetryPolicy,
    session: requests.Session,
    credential: Credential | None,
) -> requests.Response:
    """One GET of one hop, redirects not followed: the credential goes only where it applies, and a
    failure to connect becomes a Transient, except a certificate nobody vouches for (not a broken link
    but a peer that is not who it claims, so retrying cannot help)."""
    shown = _shown(current)
    hop = dict(headers)
    if credential is not None and credential.header and credential.applies(current):
        hop["Authorization"] = credential.header
    try:
        return session.get(
            urllib.parse.urlunsplit(current),
            headers=hop,
            stream=True,
            allow_redirects=False,
            timeout=(policy.timeout_s, policy.timeout_s),
        )
    except requests.exceptions.SSLError as exc:
        if _untrusted_tls(exc):  # not transient: the peer is not who it claims
            raise IntegrityError(
                f"{shown}: TLS certificate not trusted: {exc}",
                hint="a private CA goes in REQUESTS_CA_BUNDLE",
            ) from None
        raise Transient(f"{shown}: SSLError: {exc}") from None
    except (*_TRANSIENT_ERRORS, OSError) as exc:  # refused, unreachable, name lookup failed, reset
        raise Transient(f"{shown}: {_why(exc)}") from None


def _redirect_target(
    resp: requests.Response,
    current: urllib.parse.SplitResult,
    base: urllib.parse.SplitResult,
    origin: Origin,
) -> urllib.parse.SplitResult:
    """Where a redirect points, once it is allowed: the same scheme, to the origin's host or one the
    manifest names; the redirect's own response is discarded (its connection reused when it can be)."""
    asked = urllib.parse.urlunsplit(current)
    location = resp.headers.get("Location") or ""
    _discard(resp)
    target = urllib.parse.urlsplit(urllib.parse.urljoin(asked, location))
    if not _host_allowed(target, base, origin):
        raise IntegrityError(
            f"refused redirect from {_shown(current)} to "
            f"{_shown(target)}: another scheme or a host the manifest does not allow",
            hint="add the host to the origin's allowed_redirect_hosts if it is trusted",
        )
    return target


def _shown(url: urllib.parse.SplitResult) -> str:
    """A URL for messages and logs (a storage host's redirect carries a signature in its query)."""
    return redact.redact_url(urllib.parse.urlunsplit(url))


def _why(exc: BaseException) -> str:
    """The failure under requests' wrapping ("Max retries exceeded" says nothing: we retry ourselves)."""
    inner = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None
    reason = getattr(inner, "reason", None)
    shown = reason if isinstance(reason, BaseException) else exc
    return f"{shown.__class__.__name__}: {shown}"


def _discard(resp: requests.Response) -> None:
    """Close a response we do not read; a small body is read first so its connection can be reused."""
    length = header_int(resp.headers.get("Content-Length"))
    try:
        if length is not None and length <= _REDIRECT_BODY_MAX:
            resp.content  # noqa: B018 - reading it lets requests hand the connection back to the pool
    except (*_TRANSIENT_ERRORS, OSError):
        pass
    resp.close()


def response_body(resp: requests.Response) -> Any:
    """What to ``readinto``: the http.client response under urllib3's, so bytes land in our buffer
    without the copy urllib3's own readinto makes (identity encoding: there is nothing to decode)."""
    fp = getattr(resp.raw, "_fp", None)
    return fp if fp is not None and hasattr(fp, "readinto") else resp.raw


def finish_response(resp: requests.Response) -> None:
    """A body read to its end gives its connection back to the Session; anything else closes it."""
    fp = getattr(resp.raw, "_fp", None)
    if fp is not None and getattr(fp, "isclosed", lambda: False)():
        resp.raw.release_conn()
    resp.close()


def _validator(resp: requests.Response) -> dict[str, str]:
    etag = resp.headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return {"etag": etag}
    modified = resp.headers.get("Last-Modified")
    return {"last_modified": modified} if modified else {}


def read_exact(body: Any, view: memoryview, stats: Stats) -> None:
    """Fill ``view`` from a response body (``_body``) or say why not (a Transient)."""
    got = 0
    try:
        while got < len(view):
            n = body.readinto(view[got:])
            if not n:
                raise Transient("connection closed early")
            got += n
            stats.bytes_received += n
    except TimeoutError:
        raise Transient("the origin stopped sending (read timed out)") from None
    except (*_TRANSIENT_ERRORS, OSError) as exc:
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
    fetch_url(
        file_url(origin.base_url, partial.entry.name),
        origin,
        partial,
        policy=policy,
        stats=stats,
        on_bytes=on_bytes,
        sleep=sleep,
    )


def fetch_url(
    url: str,
    origin: Origin,
    partial: Partial,
    *,
    policy: RetryPolicy,
    stats: Stats,
    on_bytes: Callable[[int], None] = lambda n: None,
    sleep: Callable[[float], None] = time.sleep,
    credential: Credential | None = None,
) -> None:
    """``fetch_http`` for one URL (a hub's resolve URL), with an optional credential for its host."""
    with open_session(policy) as session, _ChunkFeed(partial, policy, stats, on_bytes) as feed:
        span = _Span(url=url, origin=origin, session=session, credential=credential)
        _fetch_all(span, partial, feed, policy, stats, sleep)


@dataclass(frozen=True, kw_only=True)
class _Span:
    """Where a run of chunks is asked for."""

    url: str
    origin: Origin
    session: requests.Session
    credential: Credential | None = None


def retry_loop(
    name: str,
    attempt: Callable[[], None],
    progress: Callable[[], int],
    policy: RetryPolicy,
    stats: Stats,
    sleep: Callable[[float], None],
    *,
    on_failure: Callable[[], None] = lambda: None,
    gave_up: Callable[[int, Transient], DgrError],
    done: Callable[[], bool],
) -> None:
    """Call ``attempt`` until ``done``; a Transient is retried with backoff while ``progress`` grows,
    and ``policy.attempts`` of them in a row (or one urllib3 already retried) end in ``gave_up``'s
    error: a Transient never leaves this loop."""
    failures = 0
    while not done():
        before = progress()
        try:
            attempt()
        except Transient as exc:
            on_failure()  # the chunk received before the failure still counts as progress
            stats.transient_failures += 1
            failures = 0 if progress() > before else failures + 1
            if exc.exhausted:
                failures = max(failures, policy.attempts)
            if failures >= policy.attempts:
                raise gave_up(failures, exc) from None
            wait = max(policy.delay(failures), min(exc.retry_after or 0.0, policy.max_retry_after_s))
            log.warning("%s: %s; retrying in %.1f s", name, exc, wait)
            sleep(wait)
            continue
        failures = 0


def incomplete_after(name: str, have: Callable[[], str]) -> Callable[[int, Transient], DgrError]:
    """What giving up on a download says: how far it got, and that a re-run resumes from there."""

    def gave_up(failures: int, exc: Transient) -> DgrError:
        return RuntimeFailure(
            f"{name}: incomplete {have()} after {failures} failed attempts ({exc})",
            hint="run the same command again to resume from the last verified chunk",
        )

    return gave_up


def retry_request(
    what: str,
    request: Callable[[], _Answer],
    policy: RetryPolicy,
    stats: Stats,
    *,
    hint: str,
    sleep: Callable[[float], None] = time.sleep,
) -> _Answer:
    """A request with nothing to resume (an API call), retried as a download is: a refused connection,
    a dead proxy, a reset or a 5xx end, once the policy's attempts are spent, in one RuntimeFailure
    naming ``what`` (exit 6), as provisioning reports a download it gave up on."""
    answers: list[_Answer] = []

    def gave_up(failures: int, exc: Transient) -> DgrError:
        return RuntimeFailure(f"{what}: gave up after {failures} failed attempts ({exc})", hint=hint)

    def attempt() -> None:
        answers.append(request())

    retry_loop(what, attempt, lambda: 0, policy, stats, sleep, gave_up=gave_up, done=lambda: bool(answers))
    return answers[0]


def read_body(resp: requests.Response, limit: int, url: str) -> bytes:
    """A whole (small) body, at most ``limit`` bytes: a read cut short is a Transient, a longer body
    a RuntimeFailure."""
    try:
        raw = resp.raw.read(limit + 1, decode_content=True)
    except (*_TRANSIENT_ERRORS, OSError) as exc:
        raise Transient(f"{_shown(urllib.parse.urlsplit(url))}: reading the answer: {_why(exc)}") from None
    if len(raw) > limit:
        raise RuntimeFailure(f"{redact.redact_url(url)}: the answer is larger than {limit} bytes")
    return raw


def _fetch_all(
    span: _Span,
    partial: Partial,
    feed: _ChunkFeed,
    policy: RetryPolicy,
    stats: Stats,
    sleep: Callable[[float], None],
) -> None:
    def attempt() -> None:
        missing = partial.missing()
        first = last = missing[0]
        while last + 1 < partial.n_chunks and last + 1 not in partial.verified:  # a set: no list scan
            last += 1
        _fetch_span(span, feed, first, last)

    retry_loop(
        partial.entry.name,
        attempt,
        lambda: len(partial.verified),
        policy,
        stats,
        sleep,
        on_failure=feed.drain,
        gave_up=incomplete_after(
            partial.entry.name, lambda: f"{partial.bytes_verified} of {partial.size} bytes"
        ),
        done=lambda: not partial.missing(),
    )


def check_status(resp: requests.Response, url: str, credential: Credential | None) -> None:
    """A transient status (urllib3 already retried it), or a refusal, as the error it is."""
    status = resp.status_code
    if status in _TRANSIENT_STATUS:
        raise Transient(
            f"{url}: HTTP {status} {resp.reason}",
            retry_after=retry_after(resp.headers.get("Retry-After")),
            exhausted=True,
        )
    if status in _ACCESS_STATUS:
        if credential is not None and credential.refused is not None:
            raise credential.refused(status)
        raise RuntimeFailure(
            f"{url}: HTTP {status} {resp.reason}: the origin refuses access (not retried)",
            hint="the URL answered, so this is about credentials or access rights: check that this "
            "machine may read that origin, or use another origin",
        )
    if status not in (200, 206):
        raise RuntimeFailure(
            f"{url}: HTTP {status} {resp.reason} (not retried)",
            hint="check the origin URL in the artifact-set manifest",
        )


def _fetch_span(span: _Span, feed: _ChunkFeed, first: int, last: int) -> None:
    partial, stats, url = feed.partial, feed.stats, span.url
    start = partial.span(first)[0]
    end = partial.span(last)[1]  # exclusive
    headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    if partial.validator and (partial.verified or start > 0):
        headers["If-Range"] = partial.validator.get("etag") or partial.validator.get("last_modified", "")
    resp = open_url(
        url, span.origin, headers, feed.policy, stats, session=span.session, credential=span.credential
    )
    try:
        check_status(resp, url, span.credential)
        if resp.status_code == 200:
            if "If-Range" in headers and _validator(resp) != partial.validator:
                log.warning(
                    "%s: origin content changed (validator); restarting from zero", partial.entry.name
                )
            stats.restarts_from_zero += 1
            partial.set_validator(_validator(resp))
            _consume(resp, feed, 0, partial.n_chunks - 1, url, whole_body=True)
            return
        got_start, got_end = check_content_range(resp, url, start, end, partial.size)
        partial.set_validator(_validator(resp))
        # A server may send a shorter range than asked; whole chunks inside it are still usable.
        last_whole = last
        while last_whole >= first and partial.span(last_whole)[1] > got_end:
            last_whole -= 1
        if last_whole < first:
            raise Transient(f"{url}: the origin sent bytes {got_start}-{got_end - 1}, less than one chunk")
        _consume(resp, feed, first, last_whole, url, whole_body=False)
    finally:
        finish_response(resp)


def check_content_range(
    resp: requests.Response, url: str, start: int, end: int, size: int
) -> tuple[int, int]:
    raw = (resp.headers.get("Content-Range") or "").strip()
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
    length = header_int(resp.headers.get("Content-Length"))
    if length is not None and length != got_last - got_start + 1:
        raise IntegrityError(f"{url}: rejected 206 response: Content-Length {length} disagrees with {raw!r}")
    return got_start, got_last + 1


def check_no_more(body: Any, url: str, size: int) -> None:
    """A whole body must end at the manifest's size."""
    try:
        extra = body.read(1)
    except (*_TRANSIENT_ERRORS, OSError):
        extra = b""
    if extra:
        raise IntegrityError(
            f"{url}: unexpected size: the origin sends more than the manifest's "
            f"{size} bytes; stopped at the expected length"
        )


def check_whole_length(resp: requests.Response, url: str, size: int) -> None:
    length = header_int(resp.headers.get("Content-Length"))
    if length is not None and length < size:
        raise IntegrityError(
            f"{url}: unexpected size: the origin sends {length} bytes, the manifest says {size}"
        )


def _consume(
    resp: requests.Response, feed: _ChunkFeed, first: int, last: int, url: str, *, whole_body: bool
) -> None:
    partial = feed.partial
    body = response_body(resp)
    if whole_body:
        check_whole_length(resp, url, partial.size)
    for index in range(first, last + 1):
        a, b = partial.span(index)
        piece = feed.next_buffer(b - a)
        read_exact(body, piece, feed.stats)
        feed.submit(index, piece)  # a 200 body restarts from zero: verified chunks are only re-hashed
    feed.drain()
    if whole_body:
        check_no_more(body, url, partial.size)


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
