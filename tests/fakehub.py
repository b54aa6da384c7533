"""A loopback stand-in for the Hugging Face Hub, its storage host, and an HTTP(S) proxy.

``FakeHub`` answers what the real hub answers where our client depends on it:
- ``/{repo}/resolve/{revision}/{path}``: 302 to the storage host, with ``X-Linked-Etag`` (the file's
  sha256, quoted), ``X-Linked-Size``, ``X-Repo-Commit``;
- ``/api/models/{repo}/revision/{revision}``: ``{"sha": commit, "siblings": [...]}``;
- ``/api/models/{repo}/tree/{commit}``: the file listing, LFS files with ``lfs.oid`` (sha256) and size
  (``Repo.answers`` replaces an API answer with raw bytes: a hostile hub);
- a gated repo answers 401 (``X-Error-Code: GatedRepo``) without ``Authorization: Bearer <token>``;
- ``rate_limit``: that many 429 (``busy_status``) answers with ``Retry-After`` before behaving.
``Storage`` is the second host (another port on 127.0.0.1): ``/blobs/<sha256>`` with Range support; it
records every request's headers and can be killed after N body bytes (it stops listening) and
restarted on the same port.  ``Proxy`` forwards absolute-form GETs and tunnels CONNECT, recording each.
All listen on 127.0.0.1, ephemeral ports, and stop on ``__exit__``.
"""

from __future__ import annotations

import hashlib
import json
import re
import select
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _quiet_handler(base: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    class Quiet(base):  # type: ignore[misc, valid-type]
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

    return Quiet


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-request or mid-answer (a downloader giving up on a 401, a test killing
    an origin) is not a server error: socketserver would print a traceback for it into the stderr of
    the process under test, where a test of one-line errors reads it."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def serve_forever(self, poll_interval: float = 0.01) -> None:
        """``shutdown()`` waits for the loop's next poll: at socketserver's default of 0.5 s a test with
        a hub and a storage host spent a second stopping them (test_hub_hostile: 44 s of the fast
        suite's 315 s of test time, most tests 1.01 s each)."""
        super().serve_forever(poll_interval)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    body_bytes: int = 0
    client_port: int = 0  # which connection it came on (a reused connection keeps its port)


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 run on a thread; ``handle(h)`` answers each GET."""

    def __init__(self, port: int = 0) -> None:
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self._start(port)

    def _start(self, port: int) -> None:
        server = self

        class Handler(_quiet_handler(BaseHTTPRequestHandler)):  # type: ignore[misc]
            def do_GET(self) -> None:  # noqa: N802
                server.handle(self)

            def do_CONNECT(self) -> None:  # noqa: N802
                server.handle(self)

        self.httpd = QuietServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    def record(self, h: BaseHTTPRequestHandler) -> Seen:
        seen = Seen(
            method=h.command,
            path=h.path,
            headers={k: v for k, v in h.headers.items()},
            client_port=h.client_address[1],
        )
        with self.lock:
            self.seen.append(seen)
        return seen

    def reply(
        self, h: BaseHTTPRequestHandler, seen: Seen, status: int, headers: dict[str, str], body: bytes = b""
    ) -> None:
        seen.status, seen.body_bytes = status, len(body)  # before the client can read the answer
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def handle(self, h: BaseHTTPRequestHandler) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Storage(_Server):
    """The host a resolve URL redirects to: content-addressed blobs with Range support."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.kill_after: int | None = None  # stop listening once this many body bytes went out
        self.sent = 0
        self.dead = False
        super().__init__()

    def add(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        self.blobs[sha] = data
        return sha

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        seen = self.record(h)
        if self.dead:
            h.close_connection = True
            return
        sha = urllib.parse.urlsplit(h.path).path.rsplit("/", 1)[-1]
        data = self.blobs.get(sha)
        if data is None:
            self.reply(h, seen, 404, {})
            return
        start, end, status = 0, len(data), 200
        match = _RANGE.match(h.headers.get("Range") or "")
        if match:
            start = int(match[1])
            end = min(int(match[2]) + 1, len(data)) if match[2] else len(data)
            status = 206
        h.send_response(status)
        h.send_header("ETag", f'"{sha}"')
        h.send_header("Accept-Ranges", "bytes")
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.send_header("Content-Length", str(end - start))
        seen.status = status
        h.end_headers()
        pos = start
        try:
            while pos < end:
                n = min(1 << 16, end - pos)
                if self.kill_after is not None:
                    n = min(n, self.kill_after - self.sent)
                    if n <= 0:
                        self._die(h)
                        return
                seen.body_bytes += n  # counted before the client can have read them
                with self.lock:
                    self.sent += n
                h.wfile.write(data[pos : pos + n])
                pos += n
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True

    def _die(self, h: BaseHTTPRequestHandler) -> None:
        """Killed mid-body: the connection drops and nothing listens any more."""
        self.dead = True
        h.wfile.flush()
        h.close_connection = True
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        threading.Thread(target=self.stop, daemon=True).start()

    def restart(self) -> None:
        """Listen again on the same port (the manifest allows that host:port)."""
        port = self.port
        deadline = time.monotonic() + 10
        while True:
            try:
                self._start(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.dead, self.kill_after = False, None

    def stop(self) -> None:
        try:
            super().stop()
        except OSError:
            pass


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes]
    branches: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    lfs: bool = True  # False: files kept in git itself (no sha256 stated)
    answers: dict[str, bytes] = field(default_factory=dict)  # "tree" / "revision": a raw body instead


class FakeHub(_Server):
    """The hub host: resolve, revision and tree answers for ``repos``; redirects to ``storage``."""

    def __init__(self, storage: Storage, *, token: str = "hf_test_token") -> None:
        self.storage = storage
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.rate_limit = 0  # answer this many requests with busy_status ...
        self.busy_status = 429  # (503: the hub is down for a while) ...
        self.retry_after = "1"  # ... asking to come back after this
        self.resolve_headers: dict[str, str] = {}  # added to (or replacing) each resolve answer's
        super().__init__()

    @property
    def endpoint(self) -> str:
        return f"http://{self.netloc}"

    def add_repo(
        self, name: str, files: dict[str, bytes], *, gated: bool = False, branch: str = "main"
    ) -> Repo:
        commit = hashlib.sha1(
            repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
        ).hexdigest()
        for data in files.values():
            self.storage.add(data)
        repo = Repo(commit=commit, files=dict(files), branches={branch: commit}, gated=gated)
        self.repos[name] = repo
        return repo

    def _commit(self, repo: Repo, revision: str) -> str | None:
        if revision == repo.commit:
            return revision
        return repo.branches.get(revision)

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        seen = self.record(h)
        if self.rate_limit > 0:
            self.rate_limit -= 1
            self.reply(h, seen, self.busy_status, {"Retry-After": self.retry_after})
            return
        path = urllib.parse.urlsplit(h.path).path
        api = re.match(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)$", path)
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        name = (api or resolve)[1] if (api or resolve) else None
        repo = self.repos.get(name or "")
        if repo is None:
            self.reply(h, seen, 404, {"X-Error-Code": "RepoNotFound"})
            return
        if repo.gated and h.headers.get("Authorization") != f"Bearer {self.token}":
            self.reply(h, seen, 401, {"X-Error-Code": "GatedRepo"}, b'{"error": "gated"}')
            return
        revision = urllib.parse.unquote((api or resolve)[3] if api else resolve[2])  # type: ignore[index]
        commit = self._commit(repo, revision)
        if commit is None:
            self.reply(h, seen, 404, {"X-Error-Code": "RevisionNotFound"})
            return
        if api and api[2] in repo.answers:
            self.reply(h, seen, 200, {"Content-Type": "application/json"}, repo.answers[api[2]])
        elif api and api[2] == "revision":
            body = {"id": name, "sha": commit, "siblings": [{"rfilename": p} for p in sorted(repo.files)]}
            self.reply(h, seen, 200, {"Content-Type": "application/json"}, json.dumps(body).encode())
        elif api:
            tree = json.dumps(self.tree(repo)).encode()
            self.reply(h, seen, 200, {"Content-Type": "application/json"}, tree)
        else:
            assert resolve is not None
            self._resolve(h, seen, repo, commit, urllib.parse.unquote(resolve[3]))

    def tree(self, repo: Repo) -> list[dict[str, Any]]:
        """The tree listing of ``repo`` as the hub writes it (a test edits it into a hostile one)."""
        out = []
        for p, data in sorted(repo.files.items()):
            entry: dict[str, Any] = {
                "type": "file",
                "path": p,
                "size": len(data),
                "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
            }
            if repo.lfs:
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            out.append(entry)
        return out

    def _resolve(self, h: BaseHTTPRequestHandler, seen: Seen, repo: Repo, commit: str, path: str) -> None:
        data = repo.files.get(path)
        if data is None:
            self.reply(h, seen, 404, {"X-Error-Code": "EntryNotFound"})
            return
        sha = hashlib.sha256(data).hexdigest()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{sha}"'}
        if repo.lfs:
            headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
        headers["Location"] = f"http://{self.storage.netloc}/blobs/{sha}?X-Amz-Signature=fake"
        self.reply(h, seen, 302, {**headers, **self.resolve_headers}, b"Found. Redirecting")


class Proxy(_Server):
    """HTTP_PROXY / HTTPS_PROXY stand-in: forwards absolute-form GETs, tunnels CONNECT; records both."""

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        seen = self.record(h)
        if h.command == "CONNECT":
            host, _, port = h.path.rpartition(":")
            upstream = socket.create_connection((host, int(port)), timeout=10)
            seen.status = 200
            h.send_response(200, "Connection established")
            h.end_headers()
            h.wfile.flush()
            self._pipe(h.connection, upstream)
            h.close_connection = True
            return
        target = urllib.parse.urlsplit(h.path)
        upstream = socket.create_connection((target.hostname, target.port or 80), timeout=10)
        lines = [f"GET {target.path or '/'}{'?' + target.query if target.query else ''} HTTP/1.1"]
        lines += [
            f"{k}: {v}"
            for k, v in h.headers.items()
            if k.lower() not in ("proxy-connection", "connection", "proxy-authorization")
        ]
        lines += ["Connection: close", "", ""]
        upstream.sendall("\r\n".join(lines).encode())
        seen.status = 200
        head = b""
        while b"\r\n\r\n" not in head and (chunk := upstream.recv(1 << 16)):
            head += chunk
        # this proxy closes after each answer, and says so (else the client would reuse the connection)
        status_line, _, rest = head.partition(b"\r\n")
        h.wfile.write(status_line + b"\r\nConnection: close\r\n" + rest)
        while chunk := upstream.recv(1 << 16):
            h.wfile.write(chunk)
            seen.body_bytes += len(chunk)
        upstream.close()
        h.close_connection = True

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 10)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            return
        finally:
            b.close()
