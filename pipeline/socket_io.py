"""Exact reads and length-prefixed frames on a TCP socket, for the driver's raw connections: the
transport floor's echo (pipeline/transport_floor.py) and the delivery port (pipeline/delivery_port.py).
A frame is the workers' pass-port wire (worker/src/sockets.h): a 4-byte little-endian length, then
that many bytes."""

from __future__ import annotations

import socket

HEAD_BYTES = 4


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``, retrying short reads; ConnectionError when the peer closes first
    (an OSError, as a failed read is)."""
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("peer closed")
        got += k


def frame(body: bytes) -> bytes:
    """``body`` with its 4-byte little-endian length in front."""
    return len(body).to_bytes(HEAD_BYTES, "little") + body
