"""The artifact store: where a set may live (storage policy), whether it fits, and who is writing.

Layout: ``<store>/<set>/<variant>/<file>`` plus, per variant directory, the sidecar and the
provenance record.  ``mounted`` sets (the 160 GiB real target) refuse a store that resolves under
/home or sits on the root filesystem (same ``st_dev`` as ``/``); ``any`` is for synthetic sets.

The per-file lock (``.<name>.lock``, ``core.locks``) only avoids duplicated work: the holder's pid
and host are written into it so a second run can name who holds it.  Correctness never depends on it; see
``fetch.ledger`` for why two runs sharing a partial still publish a verified file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigurationError, IntegrityError
from core.locks import hold
from core.workspace import refuse_links_below
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


def ensure_store(store: Path) -> Path:
    """The store root, created if missing, and writable: else one line naming it (a file, a read-only
    mount, /sys), never a traceback from deep inside a download."""
    try:
        store.mkdir(parents=True, exist_ok=True)
        usable = store.is_dir() and os.access(store, os.W_OK | os.X_OK)
        why = "" if usable else "not writable" if store.is_dir() else "not a directory"
    except OSError as exc:
        why = exc.strerror or str(exc)
    if why:
        raise ConfigurationError(
            f"store {store} is not a writable directory ({why})", hint="pass --store DIR"
        )
    return store


def prepare_dir(store: Path, directory: Path) -> Path:
    """Create ``directory`` under ``store`` refusing any link planted below the store root."""
    store = Path(os.path.abspath(store))
    directory = Path(os.path.abspath(directory))
    refuse_links_below(store, directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create {directory} in store {store}: {exc.strerror}",
            hint="pass --store DIR on a writable volume",
        ) from None
    refuse_links_below(store, directory)  # again: a link may have been planted while we created it
    return directory


def file_lock(dest: Path, *, wait_s: float = 0.0, poll_s: float = 0.2):
    """Hold ``.<name>.lock`` beside ``dest``; wait up to ``wait_s``, then fail naming the holder.

    Two runs may share a partial safely (``fetch.ledger``), so where flock does nothing the holder
    record does not exclude: both go on and the ledger keeps the result correct."""
    return hold(
        dest.with_name(f".{dest.name}.lock"),
        what=dest.name,
        wait_s=wait_s,
        poll_s=poll_s,
        held_by="is being provisioned by",
        record_excludes=False,
    )


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
