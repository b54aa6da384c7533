"""A real loopback HTTP server with fault injection, for the download tests and the benchmark.

Serves named files (bytes in memory or a path on disk via sendfile) with Range, ETag and If-Range
support, and can be told to misbehave: ignore Range (200), lie in Content-Range, close the connection
early, flip a bit, send a longer body, redirect, answer a status, or go slowly.  It counts what it sent
so tests can assert how many bytes were fetched again.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.fakehub import QuietServer

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Faults:
    ignore_range: bool = False  # answer every Range request with 200 and the whole body
    content_range: str | None = None  # send this Content-Range on 206 instead of the true one
    close_after: int | None = None  # close the connection after this many body bytes ...
    close_times: int = 1  # ... for this many responses (then behave)
    close_plan: list[int] = field(default_factory=list)  # per response, in order: body bytes before closing
    flip_offset: int | None = None  # flip the lowest bit of this byte ...
    flip_times: int = 1  # ... in this many responses that cover it
    extra: bytes = b""  # appended to whole-body (200) responses, Content-Length counting it
    extra_no_length: bool = False  # 200 responses without Content-Length (body ends at close)
    redirect: dict[str, str] = field(default_factory=dict)  # path -> Location
    status: int | None = None  # answer this status ...
    status_times: int = 0  # ... this many times
    status_headers: dict[str, str] = field(default_factory=dict)  # ... with these headers (Retry-After)
    delay_per_block: float = 0.0  # seconds to sleep per 64 KiB block (slow origin)
    stall_s: float = 0.0  # seconds to sit silent after the headers (a stalled origin)
    pause_after: int | None = None  # once this many body bytes are out, sit silent for pause_s ...
    pause_s: float = 0.0
    resume: threading.Event = field(default_factory=threading.Event)  # ... or until this is set
    no_etag: bool = False


@dataclass
class Sent:
    path: str
    range: str | None
    if_range: str | None
    status: int
    body_bytes: int


class FaultServer:
    def __init__(self, files: dict[str, bytes | Path] | None = None) -> None:
        self.files: dict[str, bytes | Path] = dict(files or {})
        self.etags: dict[str, str] = {}
        self.faults = Faults()
        self._log: list[Sent] = []
        self.lock = threading.Lock()
        self.active = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                with server.lock:
                    server.active += 1
                try:
                    server._handle(self)
                finally:
                    with server.lock:
                        server.active -= 1

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/files"

    def __enter__(self) -> FaultServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def log(self) -> list[Sent]:
        """What was served, once every handler in flight has finished (the client may return first)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.lock:
                if not self.active:
                    return list(self._log)
            time.sleep(0.005)
        raise TimeoutError("a request handler is still running")

    def bytes_sent(self, name: str | None = None) -> int:
        return sum(s.body_bytes for s in self.log if name is None or s.path.endswith("/" + name))

    def reset_log(self) -> None:
        self.log  # noqa: B018 - settle first
        with self.lock:
            self._log.clear()

    def etag(self, name: str) -> str:
        return self.etags.get(name, f'"v1-{name}"')

    # --- request handling -------------------------------------------------------------------------
    def _record(self, h: BaseHTTPRequestHandler, status: int, n: int) -> None:
        with self.lock:
            self._log.append(
                Sent(
                    path=h.path,
                    range=h.headers.get("Range"),
                    if_range=h.headers.get("If-Range"),
                    status=status,
                    body_bytes=n,
                )
            )

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        f = self.faults
        if h.path in f.redirect:
            h.send_response(302)
            h.send_header("Location", f.redirect[h.path])
            h.send_header("Content-Length", "0")
            h.end_headers()
            self._record(h, 302, 0)
            return
        if f.status is not None and f.status_times > 0:
            f.status_times -= 1
            h.send_response(f.status)
            for key, value in f.status_headers.items():
                h.send_header(key, value)
            h.send_header("Content-Length", "0")
            h.end_headers()
            self._record(h, f.status, 0)
            return
        name = h.path.rsplit("/", 1)[-1]
        if not h.path.startswith("/files/") or name not in self.files:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            self._record(h, 404, 0)
            return
        src = self.files[name]
        size = src.stat().st_size if isinstance(src, Path) else len(src)
        etag = self.etag(name)
        start, end, status = 0, size, 200
        rng = h.headers.get("Range")
        if_range = h.headers.get("If-Range")
        match = _RANGE.match(rng or "")
        if match and not f.ignore_range and (if_range is None or if_range == etag):
            start = int(match[1])
            end = min(int(match[2]) + 1, size) if match[2] else size
            status = 206
        extra = f.extra if status == 200 else b""
        h.send_response(status)
        if not f.no_etag:
            h.send_header("ETag", etag)
        if status == 206:
            h.send_header("Content-Range", f.content_range or f"bytes {start}-{end - 1}/{size}")
        if not (status == 200 and f.extra_no_length):
            h.send_header("Content-Length", str(end - start + len(extra)))
        h.send_header("Connection", "close")
        h.end_headers()
        limit = None
        if f.close_plan:
            limit = f.close_plan.pop(0)
        elif f.close_after is not None and f.close_times > 0:
            f.close_times -= 1
            limit = f.close_after
        flip = None
        if f.flip_offset is not None and f.flip_times > 0 and start <= f.flip_offset < end:
            f.flip_times -= 1
            flip = f.flip_offset
        if f.stall_s:
            h.wfile.flush()
            time.sleep(f.stall_s)
        pause = (f.pause_after, f.pause_s) if f.pause_after is not None else None
        sent = self._send_body(h, src, start, end, limit, flip, f.delay_per_block, pause)
        if limit is None and extra:
            h.wfile.write(extra)
            sent += len(extra)
        self._record(h, status, sent)
        h.close_connection = True

    def _send_body(
        self,
        h: BaseHTTPRequestHandler,
        src: bytes | Path,
        start: int,
        end: int,
        limit: int | None,
        flip: int | None,
        delay: float,
        pause: tuple[int, float] | None = None,
    ) -> int:
        stop = end if limit is None else min(end, start + limit)
        if isinstance(src, Path) and flip is None and not delay and pause is None:
            h.wfile.flush()
            with open(src, "rb") as fh:
                sent = 0
                while start + sent < stop:
                    n = os.sendfile(h.connection.fileno(), fh.fileno(), start + sent, stop - start - sent)
                    if n == 0:
                        break
                    sent += n
            return sent
        data = src.read_bytes() if isinstance(src, Path) else src
        sent = 0
        block = 1 << 16
        try:
            for pos in range(start, stop, block):
                piece = bytearray(data[pos : min(pos + block, stop)])
                if flip is not None and pos <= flip < pos + len(piece):
                    piece[flip - pos] ^= 1
                h.wfile.write(piece)
                sent += len(piece)
                if pause is not None and sent >= pause[0]:
                    h.wfile.flush()
                    self.faults.resume.wait(pause[1])
                    pause = None
                if delay:
                    h.wfile.flush()
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent
