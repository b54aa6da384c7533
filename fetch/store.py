"""The artifact store: where a set may live (storage policy), whether it fits, and who is writing.

Layout: ``<store>/<set>/<variant>/<file>`` plus, per variant directory, the sidecar and the
provenance record.  ``mounted`` sets (the 160 GiB real target) refuse a store that resolves under
/home or sits on the root filesystem (same ``st_dev`` as ``/``); ``any`` is for synthetic sets.

The per-file lock (``.<name>.lock``, ``flock``) only avoids duplicated work: the holder's pid and host
are written into it so a second run can name who holds it.  Correctness never depends on it; see
``fetch.ledger`` for why two runs sharing a partial still publish a verified file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from certify.errors import ConfigurationError, IntegrityError, RuntimeFailure
from certify.workspace import refuse_links_below
from fetch.ledger import open_nofollow
from fetch.progress import human_bytes

FORBIDDEN_PREFIXES = (Path("/home"),)


@dataclass(frozen=True, kw_only=True)
class StorePolicyCheck:
    store: Path
    resolved: Path
    device: int
    root_device: int


def _existing_ancestor(path: Path) -> Path:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    return probe


def check_policy(store: Path, policy: str, set_name: str, *, root: Path = Path("/")) -> StorePolicyCheck:
    """Refuse a store the set's storage policy does not allow (an integrity error: unsafe store)."""
    resolved = Path(os.path.realpath(store))
    device = os.stat(_existing_ancestor(resolved)).st_dev
    root_device = os.stat(root).st_dev
    check = StorePolicyCheck(store=store, resolved=resolved, device=device, root_device=root_device)
    if policy == "any":
        return check
    hint = "pass --store DIR (or DGR_STORE) on a mounted data volume"
    for prefix in FORBIDDEN_PREFIXES:
        if resolved == prefix or prefix in resolved.parents:
            raise IntegrityError(
                f"artifact set {set_name!r} needs mounted storage; store {resolved} is under {prefix}",
                hint=hint,
            )
    if device == root_device:
        raise IntegrityError(
            f"artifact set {set_name!r} needs mounted storage; store {resolved} is on the root filesystem",
            hint=hint,
        )
    return check


def free_bytes(path: Path) -> int:
    st = os.statvfs(_existing_ancestor(Path(os.path.abspath(path))))
    return st.f_bavail * st.f_frsize


def preflight(store: Path, remaining: int, *, free: Callable[[Path], int] = free_bytes) -> None:
    """Refuse to start when the store cannot hold what is left to fetch."""
    have = free(store)
    if have < remaining:
        raise ConfigurationError(
            f"not enough free space in {store}: {human_bytes(remaining)} ({remaining} bytes) still to fetch, "
            f"{human_bytes(have)} ({have} bytes) free; need {remaining - have} more bytes",
            hint="free space or pass --store DIR on a larger volume",
        )


def prepare_dir(store: Path, directory: Path) -> Path:
    """Create ``directory`` under ``store`` refusing any link planted below the store root."""
    store = Path(os.path.abspath(store))
    directory = Path(os.path.abspath(directory))
    refuse_links_below(store, directory)
    directory.mkdir(parents=True, exist_ok=True)
    refuse_links_below(store, directory)  # again: a link may have been planted while we created it
    return directory


def holder_text(lock_path: Path) -> str:
    try:
        fd = open_nofollow(lock_path, os.O_RDONLY)
    except (OSError, IntegrityError):
        return "an unknown holder"
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(512).decode("utf-8", "replace").strip()
    return text or "an unknown holder"


@contextmanager
def file_lock(dest: Path, *, wait_s: float = 0.0, poll_s: float = 0.2):
    """Hold ``.<name>.lock`` beside ``dest``; wait up to ``wait_s``, then fail naming the holder."""
    lock_path = dest.with_name(f".{dest.name}.lock")
    fd = open_nofollow(lock_path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    break  # a filesystem without working locks: go on, correctness does not need it
                if time.monotonic() >= deadline:
                    raise RuntimeFailure(
                        f"{dest.name} is being provisioned by {holder_text(lock_path)}",
                        hint="wait for it to finish, or stop it and run again",
                    ) from None
                time.sleep(poll_s)
        # A fixed-width record overwritten in place: no truncate (a journalled metadata change) per run.
        text = f"pid {os.getpid()} on host {socket.gethostname()} since {time.time():.0f}"
        os.pwrite(fd, text.encode()[:255].ljust(255) + b"\n", 0)
        yield lock_path
    finally:
        os.close(fd)  # releases the flock; the file stays so a waiter never locks an unlinked inode


def publish(partial: Path, dest: Path, fd: int) -> bool:
    """fsync, rename over the final name, fsync the directory: the final name is whole or absent.

    ``fd`` is our open partial.  False when the partial's name was already gone: a concurrent run
    (whose lock did nothing) published that shared inode first, and the caller checks ``dest``.
    """
    if dest.is_symlink():
        raise IntegrityError(
            f"{dest} is a symbolic link; refusing to publish through it", hint="remove the link and retry"
        )
    os.fsync(fd)
    try:
        os.replace(partial, dest)
    except FileNotFoundError:
        return False
    fsync_dir(dest.parent)
    return True


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

