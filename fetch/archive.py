"""Safe extraction of one subtree of a .tar.gz (RELIABILITY 15).

The whole member list is read and judged first; nothing is written unless every member passes.
Python's ``filter="data"`` is applied on top as a second layer, never as the only one.  The real
llama-cpp-python sdist holds only regular files (no links, no directories, no special modes), so
any link member at all is refused rather than reasoned about.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from core.errors import IntegrityError

_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


@dataclass(frozen=True, kw_only=True)
class Caps:
    max_members: int
    max_bytes: int


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The members to extract, with their names relative to the subtree."""

    members: tuple[tuple[tarfile.TarInfo, str], ...]
    files: int


def _unsafe_name(name: str) -> str | None:
    if not name:
        return "empty name"
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        return "control character in name"
    if "\\" in name:
        return "backslash in name"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        return "'..' component"
    if any(p in ("", ".") for p in parts):
        return "empty or '.' component"
    return None


def _judge(member: tarfile.TarInfo, prefix: str, where: str) -> None:
    """Refuse the whole archive for any member that could escape or plant something special."""
    name = member.name
    why = _unsafe_name(name)
    if why:
        raise IntegrityError(f"{where}: unsafe member {name!r}: {why}; nothing was extracted")
    if member.issym() or member.islnk():
        inside = _link_stays_inside(member, prefix)
        where_to = "inside" if inside else "outside"
        raise IntegrityError(
            f"{where}: link member {name!r} -> {member.linkname!r} (points {where_to} the subtree; "
            "the pinned archive has no links); nothing was extracted"
        )
    if member.ischr() or member.isblk() or member.isfifo():
        raise IntegrityError(f"{where}: special member {name!r} (device node or fifo); nothing was extracted")
    if not (member.type in _REGULAR or member.isdir()):
        raise IntegrityError(
            f"{where}: member {name!r} has unsupported type {member.type!r}; nothing was extracted"
        )
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        raise IntegrityError(
            f"{where}: member {name!r} has setuid/setgid mode {member.mode:o}; nothing was extracted"
        )
    if member.size < 0:
        raise IntegrityError(f"{where}: member {name!r} has a negative size")


def _link_stays_inside(member: tarfile.TarInfo, prefix: str) -> bool:
    target = member.linkname
    if target.startswith("/"):
        return False
    base = PurePosixPath(member.name).parent if member.issym() else PurePosixPath()
    parts: list[str] = []
    for part in (base / target).parts:
        if part == "..":
            if not parts:
                return False
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts).startswith(prefix + "/")


def plan_subtree(tar: tarfile.TarFile, prefix: str, caps: Caps, *, where: str) -> Plan:
    """Read every header (bounded by the caps as we go), judge every member, select the subtree."""
    prefix = prefix.strip("/")
    chosen: list[tuple[tarfile.TarInfo, str]] = []
    seen: set[str] = set()
    count = 0
    total = 0
    while (member := tar.next()) is not None:
        count += 1
        total += max(member.size, 0)
        if count > caps.max_members:
            raise IntegrityError(f"{where}: more than {caps.max_members} members; nothing was extracted")
        if total > caps.max_bytes:
            raise IntegrityError(
                f"{where}: members total more than {caps.max_bytes} bytes; nothing was extracted"
            )
        _judge(member, prefix, where)
        name = member.name.rstrip("/")
        if name != prefix and not name.startswith(prefix + "/"):
            continue
        rel = name[len(prefix) + 1 :]
        if not rel:
            continue  # the subtree's own directory entry
        if rel in seen:
            raise IntegrityError(f"{where}: member {name!r} appears twice; nothing was extracted")
        seen.add(rel)
        chosen.append((member, rel))
    if not chosen:
        raise IntegrityError(f"{where}: no member under {prefix!r}; wrong archive?")
    files = sum(1 for m, _ in chosen if not m.isdir())
    return Plan(members=tuple(chosen), files=files)


def extract_subtree(
    archive: Path,
    prefix: str,
    dest: Path,
    caps: Caps,
    *,
    where: str,
    drop: tuple[str, ...] = (),
    fileobj: BinaryIO | None = None,
) -> Plan:
    """Extract only ``prefix/`` of ``archive`` into the empty directory ``dest``.

    ``drop`` names top-level entries of the subtree to leave out (the sdist's `.git` pointer file);
    each must be a regular file when present.  ``fileobj``, when given, is the already-verified open
    file to read (so what was hashed is what is extracted, whatever happens to the path meanwhile).
    """
    if any(dest.iterdir()):
        raise IntegrityError(f"{dest} is not empty; extraction only goes into a fresh directory")
    try:
        tar = tarfile.open(archive, mode="r:gz", fileobj=fileobj)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise IntegrityError(f"{where}: {archive.name} is not a readable .tar.gz: {exc}") from None
    with tar:
        try:
            plan = plan_subtree(tar, prefix, caps, where=where)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise IntegrityError(f"{where}: corrupt archive {archive.name}: {exc}") from None
        keep: list[tarfile.TarInfo] = []
        renamed: dict[int, str] = {}
        for member, rel in plan.members:
            if rel in drop:
                if not member.isfile():
                    raise IntegrityError(f"{where}: {rel!r} in the subtree is not a plain file")
                continue
            keep.append(member)
            renamed[id(member)] = rel

        def _filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
            # Second layer: strip the prefix, then let the stdlib "data" filter judge again.
            return tarfile.data_filter(member.replace(name=renamed[id(member)], deep=False), path)

        tar.extractall(os.fspath(dest), members=keep, filter=_filter)
    return plan
