"""One lock helper for the whole project: the per-target lock files of fetch, patch, build, provision and
toolchain installs.

A lock only avoids duplicated work; correctness always comes from verify + atomic rename.  Still:
- The lock file is opened with O_NOFOLLOW and must be a regular file with one link (RELIABILITY 14): a
  planted symlink or hard link is refused, nothing is written through it.  It is never truncated.
- ``flock`` is the primary exclusion.  The holder writes a fixed-width record (pid, the pid's start
  time, host, since) and clears it to ``free`` on release, so a waiter can name the holder, and so a
  record left by a killed holder is recognised as stale (its pid is gone, or is another process now).
- Where ``flock`` fails (ENOLCK, EOPNOTSUPP) or silently does nothing (some network filesystems), the
  record is the exclusion: a live holder on this host named in it counts as holding the lock (a
  caller whose writers may safely share the target, the store's ledger, can turn that off).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
import sys
import time
import uuid
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.errors import IntegrityError, RuntimeFailure

RECORD_BYTES = 255
FREE = "free"


def _start_time(pid: int) -> str | None:
    """The pid's start time in clock ticks since boot (Linux); None where /proc cannot tell."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


def pid_alive(pid: int, started: str | None = None) -> bool:
    """Is ``pid`` a running process (and, given ``started``, the same one that wrote a record)?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    if started is not None and sys.platform.startswith("linux"):
        return _start_time(pid) in (started, None)
    return True


@dataclass(frozen=True, kw_only=True)
class Holder:
    pid: int
    started: str | None
    host: str
    since: float
    token: str

    def text(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on host {self.host} since {since}"

    def live_here(self) -> bool:
        return self.host == socket.gethostname() and pid_alive(self.pid, self.started)


def _record(token: str) -> bytes:
    started = _start_time(os.getpid()) or "-"
    text = (
        f"pid {os.getpid()} started {started} host {socket.gethostname()} since {time.time():.0f} "
        f"token {token}"
    )
    return text.encode()[:RECORD_BYTES].ljust(RECORD_BYTES) + b"\n"


def parse_holder(raw: bytes) -> Holder | None:
    """The holder a record names; None for ``free``, an old-style or unreadable record."""
    parts = raw.decode("utf-8", "replace").split()
    if len(parts) != 10 or parts[0::2] != ["pid", "started", "host", "since", "token"]:
        return None
    try:
        pid, since = int(parts[1]), float(parts[7])
    except ValueError:
        return None
    return Holder(
        pid=pid, started=None if parts[3] == "-" else parts[3], host=parts[5], since=since, token=parts[9]
    )


def _open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IntegrityError(
                f"lock file {path} is a symbolic link; refusing to write through it",
                hint="remove the link and retry",
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise IntegrityError(
            f"lock file {path} is not a plain file of its own (a hard link or a device); "
            "refusing to write into it",
            hint="remove it and retry",
        )
    return fd


def _flock(fd: int) -> str:
    """'held' (ours now), 'busy' (another holder has it) or 'none' (this filesystem has no flock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return "busy"
        return "none"
    return "held"


def holder_text(path: Path) -> str:
    """Who a lock file names as holder, for messages ('an unknown holder' when it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "an unknown holder"
    try:
        holder = parse_holder(os.pread(fd, RECORD_BYTES + 1, 0))
    finally:
        os.close(fd)
    return holder.text() if holder else "an unknown holder"


@contextmanager
def hold(
    path: Path,
    *,
    what: str,
    wait_s: float | None = None,
    poll_s: float = 0.2,
    say: Callable[[str], None] | None = None,
    held_by: str = "is held by",
    record_excludes: bool = True,
) -> Generator[Path]:
    """Hold the lock file ``path`` for ``what`` (named in messages: "<what> <held_by> <holder>").

    ``wait_s``: None waits as long as it takes (``say`` is told once whom we wait for); 0 fails at once
    naming the holder (RuntimeFailure); otherwise waits up to that many seconds, then fails.
    ``record_excludes``: a live holder named in the record excludes us even where flock said yes."""
    fd = _open(path)
    token = uuid.uuid4().hex[:16]  # tells two holders of one process apart
    mine = False
    try:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        told = False
        while True:
            state = _flock(fd)
            holder = parse_holder(os.pread(fd, RECORD_BYTES + 1, 0))
            named_live = record_excludes and holder is not None and holder.live_here()
            if state != "busy" and not named_live:
                break  # free, or a stale record of a holder that is gone: ours now
            if state == "held":  # flock said yes while a live holder is named: flock is a no-op here
                fcntl.flock(fd, fcntl.LOCK_UN)
            named = holder.text() if holder else "another process"
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeFailure(
                    f"{what} {held_by} {named}", hint="wait for it to finish, or stop it and run again"
                )
            if not told and say is not None:
                say(f"waiting for {what}, held by {named}")
                told = True
            time.sleep(poll_s)
        os.pwrite(fd, _record(token), 0)  # fixed width, in place: no truncate
        mine = True
        yield path
    finally:
        if mine:
            os.pwrite(fd, FREE.encode().ljust(RECORD_BYTES) + b"\n", 0)
        os.close(fd)  # releases the flock; the file stays so a waiter never locks an unlinked inode


def lock_file(path: Path) -> AbstractContextManager[Path]:
    """One writer per target at a time (a second run waits, saying for whom, on stderr); correctness
    still comes from verify + atomic rename. The source and patched trees are taken this way."""
    return hold(path, what=path.name, say=lambda text: print(f"dgr: {text}", file=sys.stderr))
