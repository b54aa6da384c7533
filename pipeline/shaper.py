"""A userspace link shaper for kernels without sch_netem: one process per access link of a seam fabric.

The process joins two TAP devices it creates itself: the *inner* one inside the node's network
namespace (carrying the node's address) and the *outer* one inside the hub namespace (a port of the
hub's bridge).  Every Ethernet frame travelling hub -> node (a message INTO the node) is held to the
node's link profile:

* rate: frames are serialised one after the other at ``rate`` bits per second (a token bucket one
  frame deep, which is how netem's ``rate`` behaves: no burst ever beats the rate);
* delay and jitter: after serialisation each frame waits ``delay`` plus a uniform draw in
  ``[-jitter, +jitter]`` (netem's default distribution), but never leaves before the frame ahead of it,
  so release times are monotone and the byte order of every stream is kept;
* a queue of at most ``QUEUE_LIMIT_BYTES``; frames beyond it are dropped (tail drop, as netem's limit).

Frames node -> hub are passed on at once: the receiving node's own link shapes them.  Because the
shaper works on frames below IP, anything that crosses the link is shaped (a worker's gRPC server, a
chained stage's outgoing call, the driver's sink) with no address rewriting and no port to know.

The TAP devices are not persistent: they vanish when this process exits, so a killed shaper takes its
link down with it instead of leaving a live unshaped path.

Run by pipeline.seams as ``python -m pipeline.shaper --outer-ns /run/netns/HUB --outer n3 --inner-ns
/run/netns/NODE --inner f0 --delay-ms 5 --rate-mbit 100``; it prints ``DGR-SHAPER-READY`` once both
devices exist, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass

READY = "DGR-SHAPER-READY"
QUEUE_LIMIT_BYTES = 32 << 20
FRAME_MAX = 65536

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, kw_only=True)
class Link:
    """One access link's profile: one-way delay and its jitter (seconds), rate (bits/s; None: unlimited)."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    rate_bps: float | None = None

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0 or (self.rate_bps is not None and self.rate_bps <= 0):
            raise ValueError(f"a link needs delay >= 0, jitter >= 0 and rate > 0, not {self}")

    @property
    def min_delay_s(self) -> float:
        """The shortest one-way delay any frame can see (jitter is symmetric around the delay)."""
        return max(0.0, self.delay_s - self.jitter_s)

    def serialisation_s(self, nbytes: int) -> float:
        return 0.0 if self.rate_bps is None else nbytes * 8.0 / self.rate_bps

    @classmethod
    def of(
        cls, *, delay_ms: float | None = None, jitter_ms: float | None = None, rate_mbit: float | None = None
    ) -> Link:
        """A link from the units recipes, the shaper's flags and fabric.json use (absent: 0, unlimited)."""
        return cls(
            delay_s=(delay_ms or 0.0) / 1e3,
            jitter_s=(jitter_ms or 0.0) / 1e3,
            rate_bps=None if rate_mbit is None else rate_mbit * 1e6,
        )

    def in_ms(self) -> dict[str, float | None]:
        """``delay_ms``, ``jitter_ms``, ``rate_mbit`` (None: unlimited): the inverse of ``of``."""
        return {
            "delay_ms": self.delay_s * 1e3,
            "jitter_ms": self.jitter_s * 1e3,
            "rate_mbit": None if self.rate_bps is None else self.rate_bps / 1e6,
        }


class Schedule:
    """When each frame into a link may be delivered.  Pure (the clock is an argument), so the timing
    rules are tested on synthetic timelines; the I/O loop below only asks it."""

    def __init__(self, link: Link, rng: random.Random | None = None) -> None:
        self.link = link
        self.rng = rng or random.Random()
        self._wire_free = float("-inf")  # when the last frame has been fully serialised
        self._last_release = float("-inf")

    def release(self, now: float, nbytes: int) -> float:
        link = self.link
        self._wire_free = max(self._wire_free, now) + link.serialisation_s(nbytes)
        delay = link.delay_s
        if link.jitter_s:
            delay = max(0.0, delay + self.rng.uniform(-link.jitter_s, link.jitter_s))
        self._last_release = max(self._last_release, self._wire_free + delay)
        return self._last_release


# I/O ------------------------------------------------------------------------------------------------
def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tap(name: str) -> int:
    """Create (non-persistent) and open TAP device ``name`` in the calling thread's network namespace."""
    if len(name.encode()) > 15:
        raise ValueError(f"interface name {name!r} is longer than 15 bytes")
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, False)
    return fd


def _drain(fd: int) -> list[bytes]:
    frames: list[bytes] = []
    while True:
        try:
            frames.append(os.read(fd, FRAME_MAX))
        except BlockingIOError:
            return frames
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EINTR):
                return frames
            raise


def _write(fd: int, frame: bytes) -> None:
    try:
        os.write(fd, frame)
    except OSError as exc:
        # The device is down for a moment (being configured, being deleted): the frame is lost, as
        # on a real link; TCP retransmits.
        if exc.errno not in (errno.EIO, errno.EAGAIN, errno.ENOBUFS, errno.EINVAL):
            raise


def serve(inner: int, outer: int, schedule: Schedule) -> None:
    """Forward frames until SIGTERM: outer -> inner shaped by ``schedule``, inner -> outer at once."""
    queue: deque[tuple[float, bytes]] = deque()
    queued = 0
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        ready, _, _ = select.select([inner, outer], [], [], timeout)
        now = time.monotonic()
        if outer in ready:
            for frame in _drain(outer):
                if queued + len(frame) > QUEUE_LIMIT_BYTES:
                    continue  # tail drop
                queue.append((schedule.release(now, len(frame)), frame))
                queued += len(frame)
        if inner in ready:
            for frame in _drain(inner):
                _write(outer, frame)
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, frame = queue.popleft()
            queued -= len(frame)
            _write(inner, frame)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.shaper", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--inner", required=True, help="TAP name on the node's side")
    ap.add_argument("--inner-ns", default="", help="netns path of the node ('' = the current one)")
    ap.add_argument("--outer", required=True, help="TAP name on the hub's side")
    ap.add_argument("--outer-ns", required=True, help="netns path of the hub")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--rate-mbit", type=float, default=None)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    link = Link.of(delay_ms=args.delay_ms, jitter_ms=args.jitter_ms, rate_mbit=args.rate_mbit)
    if args.inner_ns:
        _setns(args.inner_ns)
    inner = open_tap(args.inner)
    _setns(args.outer_ns)
    outer = open_tap(args.outer)
    print(READY, flush=True)
    try:
        serve(inner, outer, Schedule(link, random.Random(args.seed)))
    except SystemExit:
        pass
    finally:
        os.close(inner)
        os.close(outer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
