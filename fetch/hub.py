"""A Hugging Face Hub repository at one commit, as an origin (provision) and as a source (seal).

Files come from ``{endpoint}/{repo}/resolve/{commit}/{path}``, through the resumable, chunk-verified
downloader (``fetch.download``).  The hub answers with a redirect to its storage host; that hop is
followed only to a host the origin allows (``DEFAULT_STORAGE_HOSTS`` when the manifest names none).

- endpoint: ``HF_ENDPOINT`` (the huggingface_hub convention, for a mirror), else the origin's
  ``endpoint``, else ``DEFAULT_ENDPOINT``.
- token: ``HF_TOKEN``, else the file huggingface_hub writes (``HF_TOKEN_PATH``, else
  ``$HF_HOME/token``, HF_HOME defaulting to ``$XDG_CACHE_HOME/huggingface`` or
  ``~/.cache/huggingface``).  It is sent as ``Authorization: Bearer`` to the endpoint's own
  scheme://host:port only, never to the storage host a redirect leads to, never logged, and never
  written into a manifest, provenance file or certificate (nothing here returns it).
- a gated or private repo without a token: one line naming HF_TOKEN (exit 2).
- a revision given as a branch or tag is resolved once (``/api/models/{repo}/revision/{rev}``) to its
  40-hex commit, which is what a manifest records; the repo tree at that commit
  (``/api/models/{repo}/tree/{commit}``) states each LFS file's size and sha256.

Sealing downloads each file once into staging (resumable at chunk boundaries: a re-run hashes the
chunks already there and asks for the rest), computing size, sha256, blake3 and the per-chunk blake3
digests as the bytes land, then holds size and sha256 against the hub's own metadata for that commit
(the tree listing and, where the resolve answer carries them, ``X-Linked-Size`` / ``X-Linked-Etag``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import requests

from core import redact
from core.canonical import parse_json
from core.errors import ConfigurationError, DgrError, IntegrityError, RuntimeFailure
from core.hashing import chunk_digest
from fetch.download import (
    Credential,
    RetryPolicy,
    Stats,
    check_content_range,
    check_no_more,
    check_status,
    check_whole_length,
    fetch_url,
    finish_response,
    header_int,
    incomplete_after,
    open_url,
    read_body,
    read_exact,
    response_body,
    retry_loop,
    retry_request,
)
from fetch.ledger import DiskFull, Partial, open_nofollow, pwrite_all
from fetch.store import free_bytes
from manifests.artifact_sets import Origin
from manifests.loader import validate

DEFAULT_ENDPOINT = "https://huggingface.co"
# Where the public hub redirects resolve URLs to (LFS and Xet storage); a manifest's
# allowed_redirect_hosts replaces this list (a mirror, a private hub).
DEFAULT_STORAGE_HOSTS = (
    "cdn-lfs.huggingface.co",
    "cdn-lfs-us-1.huggingface.co",
    "cdn-lfs-eu-1.huggingface.co",
    "cdn-lfs.hf.co",
    "cdn-lfs-us-1.hf.co",
    "cdn-lfs-eu-1.hf.co",
    "cas-bridge.xethub.hf.co",
)
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_API_MAX = 64 << 20  # the most JSON we read from one API answer
_TOKEN = re.compile(r"[!-~]+")  # what a header value may carry unquoted: printable ASCII, no space


@dataclass(frozen=True, kw_only=True)
class HubRef:
    repo: str
    revision: str  # a commit, a branch or a tag, as the operator typed it


def parse_ref(text: str) -> HubRef:
    """``OWNER/REPO@REVISION`` (the part after ``hub:``); no revision means ``main``."""
    repo, _, revision = text.partition("@")
    if not _REPO.match(repo):
        raise ConfigurationError(
            f"hub repository {repo!r} is not OWNER/NAME", hint="--from hub:OWNER/REPO@REVISION"
        )
    revision = revision or "main"
    if any(c.isspace() or ord(c) < 0x20 for c in revision) or ".." in revision:
        raise ConfigurationError(f"hub revision {revision!r} is not a commit, branch or tag name")
    return HubRef(repo=repo, revision=revision)


def endpoint(origin_endpoint: str | None, env: Mapping[str, str]) -> str:
    """HF_ENDPOINT, else the origin's endpoint, else the public hub; checked before anything is asked
    of the network (exit 2, no retries): a malformed one was a ValueError deep inside urllib, and one
    requests cannot use was retried for half a minute as if the network were down."""
    given, where = env.get("HF_ENDPOINT"), "HF_ENDPOINT"
    if not given:
        given, where = origin_endpoint or DEFAULT_ENDPOINT, "the hub origin's endpoint"
    url = given.rstrip("/")
    fault = _endpoint_fault(url)
    if fault:
        raise ConfigurationError(
            f"{where} {redact.redact_url(url)!r} is not the http(s) URL of a hub: {fault}",
            hint="e.g. https://huggingface.co, or http://HOST:PORT for a mirror",
        )
    return url


def _endpoint_fault(url: str) -> str | None:
    """What makes ``url`` unusable as an endpoint, or None; its password is remembered as a secret."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds a space or a control character"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:  # an unclosed IPv6 bracket, a port out of range or not a number
        return str(exc)
    redact.remember(parts.password)
    if parts.scheme not in ("http", "https"):
        return f"the scheme is {parts.scheme or 'missing'}, not http or https"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "port 0"
    if parts.query or parts.fragment:
        return "it has a query or a fragment"
    return None


def token_file(env: Mapping[str, str]) -> Path:
    if env.get("HF_TOKEN_PATH"):
        return Path(env["HF_TOKEN_PATH"]).expanduser()
    home = env.get("HF_HOME")
    if not home:
        user = env.get("HOME") or os.path.expanduser("~")
        cache = env.get("XDG_CACHE_HOME") or os.path.join(user, ".cache")
        home = os.path.join(cache, "huggingface")
    return Path(home).expanduser() / "token"


def token(env: Mapping[str, str]) -> str | None:
    """HF_TOKEN, else huggingface_hub's token file; None when neither holds one.

    The value is remembered as a secret (``core.redact``) before it is looked at, then refused (exit 2,
    naming where it came from, never what it holds) unless it is printable ASCII without spaces: a line
    break would end the Authorization header and start another, and requests quotes the whole header
    in the error it raises for one."""
    value, where = (env.get("HF_TOKEN") or "").strip(), "HF_TOKEN"
    if not value:
        path = token_file(env)
        try:
            value, where = path.read_text(encoding="utf-8").strip(), f"the token file {path}"
        except (OSError, UnicodeDecodeError):
            return None
    if not value:
        return None
    redact.remember(value)
    if not _TOKEN.fullmatch(value):
        raise ConfigurationError(
            f"{where} holds a line break, a space or a character outside printable ASCII, which no "
            "hub token holds; refusing to send it",
            hint=f"put the token alone, on one line, in {where}",
        )
    return value


def credential(base: str, repo: str, env: Mapping[str, str]) -> Credential:
    """The hub host's credential (a Bearer token, or none) and what a 401/403 from it means."""
    secret = token(env)

    def refused(status: int) -> DgrError:
        if secret is None:
            return ConfigurationError(
                f"{repo} is gated or private (HTTP {status}) and no token is set: set HF_TOKEN",
                hint=f"export HF_TOKEN=<a token that may read it>, or log in with huggingface_hub, "
                f"which writes {token_file(env)}",
            )
        return ConfigurationError(
            f"{repo}: the hub refuses the token from HF_TOKEN or {token_file(env)} (HTTP {status})",
            hint="accept the repository's terms on the hub with that account, or set HF_TOKEN to a "
            "token that may read it",
        )

    return Credential(url=base, header=f"Bearer {secret}" if secret else None, refused=refused)


def resolve_url(base: str, repo: str, commit: str, path: str) -> str:
    return f"{base}/{repo}/resolve/{commit}/{urllib.parse.quote(path)}"


def effective(origin: Origin, env: Mapping[str, str]) -> Origin:
    """The origin as the downloader sees it: the endpoint as base, the storage hosts it may follow."""
    return dataclasses.replace(
        origin,
        base_url=endpoint(origin.endpoint, env),
        allowed_redirect_hosts=origin.allowed_redirect_hosts or DEFAULT_STORAGE_HOSTS,
    )


def fetch_hub(
    origin: Origin,
    partial: Partial,
    *,
    env: Mapping[str, str],
    policy: RetryPolicy,
    stats: Stats,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> None:
    """Provision one file of a hub origin: its resolve URL at the sealed commit, chunk-verified."""
    name = partial.entry.name
    if origin.revision is None or not COMMIT.match(origin.revision):
        raise ConfigurationError(f"hub origin {origin.repo} names no commit; seal the set from it first")
    if origin.paths and name not in origin.paths:
        raise ConfigurationError(f"{name} is not among the files sealed from {origin.repo}")
    assert origin.repo is not None
    eff = effective(origin, env)
    assert eff.base_url is not None
    fetch_url(
        resolve_url(eff.base_url, origin.repo, origin.revision, name),
        eff,
        partial,
        policy=policy,
        stats=stats,
        on_bytes=on_bytes,
        credential=credential(eff.base_url, origin.repo, env),
    )


# --- the hub's API: revision -> commit, the tree at a commit ----------------------------------------


@dataclass(frozen=True, kw_only=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # an LFS file's; None for a file kept in git itself


_FILE = object()  # index_files: a path part that is a file, not a folder
_SHOWN_MAX = 300  # of a refusal's detail: the hub wrote it, and may have written megabytes


def _checked(raw: bytes, *, source: str, schema: str) -> Any:
    """An API answer through the bounded JSON reader (size, depth, duplicate keys, NaN), then its
    schema; anything else is one RuntimeFailure naming the answer (exit 6: the hub's answer is not
    the operator's configuration, and a bad one fails like one that never came)."""
    try:
        data = parse_json(raw, source=source, max_bytes=_API_MAX)
        validate(data, schema, source=source)
    except ConfigurationError as exc:  # BadJson is one
        shown = exc.message if len(exc.message) <= _SHOWN_MAX else exc.message[:_SHOWN_MAX] + "..."
        raise RuntimeFailure(shown, hint="the hub (or HF_ENDPOINT's mirror) answers out of shape") from None
    return data


def read_commit(raw: bytes, *, source: str, repo: str, revision: str) -> str:
    """The commit a revision answer names (manifests/schemas/hub-revision.schema.json)."""
    sha: str = _checked(raw, source=source, schema="hub-revision")["sha"]
    if COMMIT.match(revision) and sha != revision:
        raise IntegrityError(f"{repo}: asked for commit {revision}, the hub answers {sha}")
    return sha


def read_tree_page(raw: bytes, *, source: str) -> list[HubFile]:
    """The files one page of a tree listing states (manifests/schemas/hub-tree.schema.json)."""
    entries = _checked(raw, source=source, schema="hub-tree")
    return [_hub_file(e, source) for e in entries if e["type"] == "file"]


def _hub_file(entry: dict[str, Any], source: str) -> HubFile:
    """One file's entry, once its sizes are plain non-negative integers that agree (a JSON 5.0 passes
    the schema's "integer", and an LFS pointer states the size a second time)."""
    path: str = entry["path"]
    lfs: dict[str, Any] = entry.get("lfs") or {}
    sizes = [entry["size"], *([lfs["size"]] if "size" in lfs else [])]
    if any(type(n) is not int for n in sizes):
        raise RuntimeFailure(f"{source}: {ascii(path[:200])}: size {sizes[0]!r} is not an integer")
    if len(set(sizes)) > 1:
        raise RuntimeFailure(f"{source}: {ascii(path[:200])}: the listing states two sizes, {sizes}")
    sha = lfs.get("oid") or lfs.get("sha256")
    return HubFile(
        path=path,
        size=sizes[0],
        sha256=sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) else None,
    )


def index_files(listed: list[HubFile], *, source: str) -> dict[str, HubFile]:
    """The listing's files by path, refusing a path listed twice or one that is both a file and a
    folder (``a.gguf`` and ``a.gguf/x.gguf``: staging could not hold both).  A tree of path parts
    keeps it linear in the listing's size."""
    files: dict[str, HubFile] = {}
    root: dict[str, Any] = {}
    for entry in listed:
        parts = entry.path.split("/")
        node = root
        for depth, part in enumerate(parts, 1):
            here = node.get(part)
            if here is _FILE or (depth == len(parts) and here is not None):
                what = "twice" if entry.path in files else "both as a file and as a folder"
                shown = ascii("/".join(parts[:depth])[:200])[1:-1]
                raise RuntimeFailure(f"{source} lists {shown} {what}; refusing the listing")
            node = node.setdefault(part, _FILE if depth == len(parts) else {})
        files[entry.path] = entry
    return files


@dataclass(frozen=True, kw_only=True)
class _Answer:
    """One API answer: its body (at most ``_API_MAX`` bytes), the URL that gave it, its next page."""

    body: bytes
    url: str
    next_url: str | None


@dataclass
class Hub:
    """One repository on one endpoint, over one Session (reused for the API and the downloads)."""

    origin: Origin  # as ``effective`` made it
    repo: str
    session: requests.Session
    credential: Credential
    policy: RetryPolicy
    stats: Stats = field(default_factory=Stats)

    @property
    def base(self) -> str:
        assert self.origin.base_url is not None
        return self.origin.base_url

    def commit(self, revision: str) -> str:
        """The 40-hex commit a branch, tag or commit names, asked once."""
        quoted = urllib.parse.quote(revision, safe="")
        answer = self._answer(f"{self.base}/api/models/{self.repo}/revision/{quoted}")
        source = f"the hub's answer for {self.repo}@{revision} ({redact.redact_url(answer.url)})"
        return read_commit(answer.body, source=source, repo=self.repo, revision=revision)

    def tree(self, commit: str) -> dict[str, HubFile]:
        """Every file of the repo at ``commit`` (the listing's pages, followed on the same host)."""
        listed: list[HubFile] = []
        answer = self._answer(f"{self.base}/api/models/{self.repo}/tree/{commit}?recursive=true")
        for _page in range(10_000):
            source = f"the hub's tree listing of {self.repo} ({redact.redact_url(answer.url)})"
            listed += read_tree_page(answer.body, source=source)
            if not answer.next_url:
                return index_files(listed, source=f"the hub's tree listing of {self.repo}@{commit}")
            answer = self._answer(self._next_page(answer))
        raise RuntimeFailure(f"{self.repo}: the tree listing does not end")

    def _next_page(self, answer: _Answer) -> str:
        """The listing's next page, only on the endpoint's own host (a Link header is the hub's to
        write: one too malformed to join is refused like one pointing elsewhere)."""
        assert answer.next_url is not None
        try:
            target = urllib.parse.urlsplit(urllib.parse.urljoin(answer.url, answer.next_url))
        except ValueError:
            raise RuntimeFailure(f"{self.repo}: the tree listing's next page is not a URL") from None
        if target.netloc != urllib.parse.urlsplit(self.base).netloc:
            raise IntegrityError(f"{self.repo}: the tree listing's next page is on another host")
        return urllib.parse.urlunsplit(target)

    def _answer(self, url: str) -> _Answer:
        """One API answer, asked until it comes (retried as a download's chunk is), then one line."""
        return retry_request(
            "the hub's API",
            lambda: self._answer_once(url),
            self.policy,
            self.stats,
            hint="check HF_ENDPOINT, the network and any proxy (HTTPS_PROXY, NO_PROXY), then run again",
        )

    def _answer_once(self, url: str) -> _Answer:
        resp = open_url(
            url,
            self.origin,
            {"Accept": "application/json"},
            self.policy,
            self.stats,
            session=self.session,
            credential=self.credential,
        )
        with resp:
            if resp.status_code == 404:
                raise ConfigurationError(
                    f"the hub at {self.base} has no {self.repo} or no such revision ({url})",
                    hint="check OWNER/REPO@REVISION (a gated repo without a token may also answer 404)",
                )
            check_status(resp, url, self.credential)
            next_url = resp.links.get("next", {}).get("url")
            return _Answer(body=read_body(resp, _API_MAX, url), url=resp.url, next_url=next_url)

    def download(
        self,
        commit: str,
        entry: HubFile,
        dest: Path,
        chunk_size: int,
        *,
        on_bytes: Callable[[int], None] = lambda n: None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any]:
        """Download ``entry`` into ``dest`` (resuming what is there), hashing as bytes land; returns
        size, sha256, blake3 and chunk digests, held against the hub's metadata."""
        url = resolve_url(self.base, self.repo, commit, entry.path)
        sink = _Sink(dest, entry.size, chunk_size, on_bytes)
        linked: list[dict[str, str]] = []
        try:
            retry_loop(
                entry.path,
                lambda: self._download_span(url, sink, linked),
                lambda: sink.have,
                self.policy,
                self.stats,
                sleep,
                gave_up=incomplete_after(entry.path, lambda: f"{sink.have} of {entry.size} bytes"),
                done=lambda: sink.have >= entry.size,
            )
            digests = sink.finish()
        except DiskFull:
            raise _disk_full(entry, sink) from None
        finally:
            sink.close()
        try:
            _hold(entry, digests, linked, url)
        except IntegrityError:
            dest.unlink(missing_ok=True)
            raise
        return digests

    def _download_span(self, url: str, sink: _Sink, linked: list[dict[str, str]]) -> None:
        headers = {"Accept-Encoding": "identity"}
        if sink.have:
            headers["Range"] = f"bytes={sink.have}-{sink.size - 1}"
        hops: list[dict[str, str]] = []
        resp = open_url(
            url,
            self.origin,
            headers,
            self.policy,
            self.stats,
            session=self.session,
            credential=self.credential,
            hops=hops,
        )
        linked.extend(hops)
        try:
            check_status(resp, url, self.credential)
            if resp.status_code == 200:
                sink.restart()
                check_whole_length(resp, url, sink.size)
            else:
                check_content_range(resp, url, sink.have, sink.size, sink.size)
            body = response_body(resp)
            while sink.have < sink.size:
                view = sink.next_view()
                read_exact(body, view, self.stats)
                sink.land(view)
            if resp.status_code == 200:
                check_no_more(body, url, sink.size)
        finally:
            finish_response(resp)


def _disk_full(entry: HubFile, sink: _Sink) -> RuntimeFailure:
    """A full disk stops the seal at once; the whole chunks staged stay for the re-run to resume from,
    and the line says how much more this file needs (as provisioning's does)."""
    return RuntimeFailure(
        f"disk full staging {entry.path}: {sink.have} of {entry.size} bytes staged and kept; need "
        f"{entry.size - sink.have} more bytes for this file (free {free_bytes(sink.dest.parent)})",
        hint="free space in the workspace (DGR_WORK) and run the seal again to resume",
    )


def _hold(entry: HubFile, digests: dict[str, Any], linked: list[dict[str, str]], url: str) -> None:
    """The bytes must be what the hub says this commit holds: size and sha256 (tree, linked headers)."""
    if digests["size"] != entry.size:
        raise IntegrityError(
            f"{entry.path}: {digests['size']} bytes landed, the hub's tree says {entry.size}"
        )
    stated = {entry.sha256} if entry.sha256 else set()
    for h in linked:
        lower = {k.lower(): v for k, v in h.items()}
        etag = lower.get("x-linked-etag", "").strip().removeprefix("W/").strip('"')
        if re.fullmatch(r"[0-9a-f]{64}", etag):
            stated.add(etag)
        size = header_int(lower.get("x-linked-size"))
        if size is not None and size != entry.size:
            raise IntegrityError(f"{url}: X-Linked-Size {size}, the hub's tree says {entry.size}")
    if not stated:
        raise IntegrityError(
            f"{entry.path}: the hub states no sha256 for it (not an LFS file); refusing to seal it unchecked"
        )
    if stated != {digests["sha256"]}:
        raise IntegrityError(
            f"{entry.path}: sha256 {digests['sha256']} landed, the hub states {', '.join(sorted(stated))}",
            hint="the staged copy was removed; run the seal again",
        )


class _Sink:
    """The staged file and its running digests; only whole chunks are written (a re-run resumes at the
    last one, after hashing what is there)."""

    def __init__(self, dest: Path, size: int, chunk_size: int, on_bytes: Callable[[int], None]) -> None:
        self.dest, self.size, self.chunk_size, self.on_bytes = dest, size, chunk_size, on_bytes
        self.fd = open_nofollow(dest, os.O_RDWR | os.O_CREAT)  # its folder: the caller's, link-free
        self.buffer = memoryview(bytearray(chunk_size))
        self._reset()
        have = min(os.fstat(self.fd).st_size, size)
        if have != size:
            have -= have % chunk_size  # a chunk cut short is asked for again
        os.ftruncate(self.fd, have)
        while self.have < have:  # what an earlier run left: hashed again, counted as done
            view = self.next_view()
            n = os.preadv(self.fd, [view], self.have)
            if n != len(view):
                raise RuntimeFailure(f"{dest}: short read at byte {self.have}")
            self._feed(view)

    def _reset(self) -> None:
        self.have = 0
        self.sha = hashlib.sha256()
        self.whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self.chunks: list[str] = []

    def restart(self) -> None:
        """A 200: the body starts at byte 0."""
        if self.have:
            os.ftruncate(self.fd, 0)
            self._reset()

    def next_view(self) -> memoryview:
        return self.buffer[: min(self.chunk_size, self.size - self.have)]

    def land(self, view: memoryview) -> None:
        pwrite_all(self.fd, view, self.have, self.dest)  # ENOSPC: a DiskFull, as provisioning's
        self._feed(view)
        self.on_bytes(len(view))

    def _feed(self, view: memoryview) -> None:
        self.sha.update(view)
        self.whole.update(view)
        self.chunks.append(chunk_digest(view))
        self.have += len(view)

    def finish(self) -> dict[str, Any]:
        os.fsync(self.fd)
        return {
            "size": self.have,
            "sha256": self.sha.hexdigest(),
            "blake3": self.whole.hexdigest(),
            "chunks": list(self.chunks),
        }

    def close(self) -> None:
        os.close(self.fd)


def open_hub(
    repo: str,
    *,
    origin: Origin,
    env: Mapping[str, str],
    policy: RetryPolicy,
    session: requests.Session,
) -> Hub:
    eff = effective(origin, env)
    assert eff.base_url is not None
    return Hub(
        origin=eff, repo=repo, session=session, credential=credential(eff.base_url, repo, env), policy=policy
    )
