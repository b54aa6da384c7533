"""The driver's delivery port: a ring's deliveries as frames on a TCP connection from its last stage.

A ring's last stage hands the driver every token (worker/README.md, "Ring decode").  As a Deliver call
each, a token cost the driver's gRPC server about 280 us of its threads' CPU and the worker's delivery
and gRPC threads about 160 us more (stop 33's per-thread probe), taken from the stages where they share
the cores.  When the ring names this port (``Ring.delivery_stream``), the last stage sends each
Delivery as one frame instead (a 4-byte little-endian length, then the serialized message; the
worker's side is worker/src/delivery_streams.h): one thread per connection reads it, parses it and
hands it to ``take``.  A delivery ``take`` refuses is answered with a framed ``DeliveryRefused`` on the
same connection, and the last stage stops that ring.

A frame over ``max_bytes``, or one that does not parse, closes its connection; the last stage then
stops every ring it delivers there ("the driver closed its delivery stream").  Written by hand: the
frame is the worker's own pass-port wire, and no library speaks it.

    port = DeliveryPort(pb2, take, host="127.0.0.1")   # take(delivery, received_at) -> None | reason
    ring.delivery_stream = port.start()                 # "127.0.0.1:PORT"
    ...
    port.stop()
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from types import ModuleType

from google.protobuf.message import DecodeError

from core import redact
from core.errors import ConfigurationError
from pipeline.socket_io import HEAD_BYTES, frame, recv_exact
from worker import wire
from worker.client import MAX_MESSAGE_BYTES
from worker.tls import Identity, server_context

log = redact.logger("dgr.delivery")

JOIN_SECONDS = 5.0
HANDSHAKE_SECONDS = 10.0  # a connection that does not prove itself in this long gives its thread back


def read_exact(conn: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None when the peer closed or the connection failed first."""
    buf = bytearray(n)
    try:
        recv_exact(conn, memoryview(buf))
    except OSError:
        return None
    return bytes(buf)


class DeliveryPort:
    """Listens on ``host`` (a free port) for last stages' delivery streams; every delivery goes to
    ``take(delivery, received_at)``, which returns None when it took it or the reason it refuses it."""

    def __init__(
        self,
        pb2: ModuleType,
        take: Callable[[wire.Delivery, float], str | None],
        *,
        host: str,
        max_bytes: int = MAX_MESSAGE_BYTES,
        tls: Identity | None = None,
    ) -> None:
        self._pb2 = pb2
        # workers started with --tls stream their deliveries over mutual TLS to this identity
        self._tls = server_context(tls) if tls is not None else None
        self._take = take
        self._host = host.strip("[]")
        self._max_bytes = max_bytes
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._accepting: threading.Thread | None = None
        self.address = ""
        self.frames = 0  # deliveries read, taken or refused

    def start(self) -> str:
        """Bind and accept; return ``host:port``.  ConfigurationError when the host cannot be bound."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            listener = socket.create_server((self._host, 0), family=family)
        except OSError as exc:
            raise ConfigurationError(
                f"the driver's delivery port cannot listen on {self._host}: {exc.strerror}",
                hint="sink_host must be an address of this machine that the last stage can reach",
            ) from None
        self._listener = listener
        port = listener.getsockname()[1]
        self.address = f"[{self._host}]:{port}" if family == socket.AF_INET6 else f"{self._host}:{port}"
        self._accepting = self._spawn(self._accept, listener, "dgr-delivery-accept")
        return self.address

    def stop(self) -> None:
        """Close the port and every connection, and wait for their threads."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is None:
            return
        _shut(listener)  # accept returns: no connection or thread is added after this
        assert self._accepting is not None  # start() set it with the listener
        self._accepting.join(JOIN_SECONDS)
        with self._lock:
            open_now, readers = list(self._connections), list(self._threads)
        for conn in open_now:
            _shut(conn)  # its reader's recv returns; the reader closes it
        for thread in readers:
            thread.join(JOIN_SECONDS)
        listener.close()

    def _spawn(
        self, target: Callable[[socket.socket], None], sock: socket.socket, name: str
    ) -> threading.Thread:
        thread = threading.Thread(target=target, args=(sock,), name=name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()
        return thread

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stop() shut the listener down
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._listener is None:
                    conn.close()
                    return
                self._connections.add(conn)
            self._spawn(self._read, conn, "dgr-delivery-read")

    def _wrapped(self, conn: socket.socket, context: ssl.SSLContext) -> ssl.SSLSocket:
        """``conn`` as a TLS socket, handshake still to come (within HANDSHAKE_SECONDS): its file
        descriptor moves to the new socket, which takes its place among the connections stop() shuts."""
        conn.settimeout(HANDSHAKE_SECONDS)
        secure = context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        with self._lock:
            self._connections.discard(conn)
            self._connections.add(secure)
        return secure

    def _read(self, conn: socket.socket) -> None:
        try:
            if self._tls is not None:  # a client certificate of our CA, or nothing reaches take()
                conn = self._wrapped(conn, self._tls)
                conn.do_handshake()
                conn.settimeout(None)
            while (delivery := self._next(conn)) is not None:
                with self._lock:
                    self.frames += 1
                reason = self._take(delivery, time.perf_counter())
                if reason is not None:
                    refused = self._pb2.DeliveryRefused(request_id=delivery.request_id, reason=reason)
                    conn.sendall(frame(refused.SerializeToString()))
        except OSError:
            pass  # the last stage went away, or stop() shut the connection down
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _next(self, conn: socket.socket) -> wire.Delivery | None:
        """The next delivery on ``conn``; None when it closed or sent what is not one (then closed)."""
        head = read_exact(conn, HEAD_BYTES)
        if head is None:
            return None
        n = int.from_bytes(head, "little")
        if n > self._max_bytes:
            log.warning(
                "delivery port: a %d-byte frame is over the limit of %d; closing the connection",
                n,
                self._max_bytes,
            )
            return None
        body = read_exact(conn, n)
        if body is None:
            return None
        try:
            return self._pb2.Delivery.FromString(body)
        except DecodeError:
            log.warning("delivery port: a frame that is not a Delivery; closing the connection")
            return None


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected (a listener on some systems) or already closed
