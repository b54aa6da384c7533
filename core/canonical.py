"""Canonical JSON (sorted keys, no insignificant whitespace, UTF-8), digests and atomic writes, and the
readers every file the tool reads goes through: ``read_json`` (bounded JSON), ``read_text`` and
``read_bounded`` (bytes).

Every file read is a regular file, read bounded: a FIFO or a device is refused before it is read.

One encoding policy for every file read (RELIABILITY 26): strict UTF-8 and no lone surrogate, else one
line naming the file (exit 2; 3 for a certificate).  Python's ``utf-8`` codec already refuses invalid
bytes and encoded surrogates; a JSON ``\\udc80`` escape gets past it and ``json`` turns it into a str
that no encoder accepts, so a digest, a signature or a print far from the file crashed on it.  Refusing
it where the file is read keeps every later encode total.

The JSON reader also refuses, with one line naming the file and the reason, what ``json.load`` would
accept or crash on: more than ``MAX_JSON_BYTES``, nesting deeper than ``MAX_JSON_DEPTH`` (``json``
recurses: 1000 nested arrays are a RecursionError), a duplicate key (``json`` keeps the last one
silently), ``NaN`` / ``Infinity`` / a number that overflows to infinity.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, TypeGuard

from core.errors import ConfigurationError, DgrError, IntegrityError
from core.hashing import digest_file

MAX_JSON_BYTES = 32 << 20  # the largest file we write is a certificate of a few hundred KiB
MAX_JSON_DEPTH = 64  # ours nest 8 deep at most
MAX_TEXT_BYTES = 1 << 20  # the text files we read (patches/series, commit messages) are a few KiB
_NOT_REGULAR = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a str from strict UTF-8 holds none; a \\u escape can


def canonical_bytes(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_digest(value: Any) -> str:
    """sha256 hex of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 hex of a file's bytes (core.hashing's one pass over an mmap)."""
    digest = digest_file(path, sha256=True, blake3=False).sha256
    assert digest is not None
    return digest


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write beside the destination, fsync, rename: readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600 files; published files get the usual umask-governed mode.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any, *, pretty: bool = True) -> None:
    """Human-readable JSON on disk (digests are always taken over ``canonical_bytes``)."""
    if pretty:
        text = json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        atomic_write_bytes(path, text.encode("utf-8"))
    else:
        atomic_write_bytes(path, canonical_bytes(value))


class BadJson(ConfigurationError, ValueError):
    """A configuration or record file the bounded reader refused (exit 2).

    Also a ValueError, so a caller that treats an unreadable record as absent keeps doing so."""


class BadSignedJson(IntegrityError, ValueError):
    """A certificate or signed payload the bounded reader refused (exit 3)."""


class BadText(ConfigurationError, ValueError):
    """A text file (not JSON) that breaks the encoding policy or its size bound (exit 2)."""


def decode_text(data: bytes | str, *, source: str, error: type[DgrError] = BadText) -> str:
    """``data`` as text under the one encoding policy: strict UTF-8, no lone surrogate."""
    if isinstance(data, str):
        bad = _LONE_SURROGATE.search(data)
        if bad:
            raise error(
                f"{source} is not UTF-8 text: lone surrogate {ascii(bad[0])} at character {bad.start()}"
            )
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{source} is not UTF-8 text: {exc.reason} at byte {exc.start}",
            hint="files are read as strict UTF-8",
        ) from None


def is_json_object(value: object) -> TypeGuard[dict[str, Any]]:
    """A JSON object as the reader parses one: a dict whose keys are strings."""
    return isinstance(value, dict)


def is_json_array(value: object) -> TypeGuard[list[Any]]:
    """A JSON array as the reader parses one: a list."""
    return isinstance(value, list)


def _pointer(where: tuple[Any, ...]) -> str:
    """The JSON pointer of a place ``_tree_problem`` walked to (a linked (parent, key) tuple)."""
    parts: list[str] = []
    while where:
        where, key = where
        parts.append(str(key))
    return "/" + "/".join(reversed(parts))


def _surrogate_in(text: str, where: tuple[Any, ...], what: str) -> str | None:
    bad = _LONE_SURROGATE.search(text)
    return f"lone surrogate {ascii(bad[0])} at {_pointer(where)} ({what})" if bad else None


def _tree_problem(value: Any, max_depth: int) -> str | None:
    """What a parsed document breaks, found in one walk without recursing: nesting deeper than
    ``max_depth``, or a lone surrogate in a key or string (the encoding policy), named by its pointer."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        item, level, where = stack.pop()
        if isinstance(item, str):
            if problem := _surrogate_in(item, where, "a \\u escape naming half a character; not UTF-8"):
                return problem
        elif is_json_object(item) or is_json_array(item):
            if level > max_depth:
                return f"nested deeper than {max_depth} levels"
            for key, child in item.items() if is_json_object(item) else enumerate(item):
                if isinstance(key, str) and (problem := _surrogate_in(key, where, "in a key")):
                    return problem
                stack.append((child, level + 1, (where, key)))
    return None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_json(
    data: bytes | str,
    *,
    source: str,
    signed: bool = False,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """The bounded reader over bytes already in memory; raises BadJson (BadSignedJson if ``signed``)."""
    error = BadSignedJson if signed else BadJson
    if len(data) > max_bytes:
        raise error(f"{source} is larger than {max_bytes} bytes; refusing to read it as JSON")
    text = decode_text(data, source=source, error=error)
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite
        )
    except RecursionError:
        raise error(f"{source} is not valid JSON: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise error(f"{source} is not valid JSON: {exc}") from None
    problem = _tree_problem(value, max_depth)
    if problem:
        raise error(f"{source} is not valid JSON: {problem}")
    return value


def read_bounded(path: Path, *, max_bytes: int, error: type[DgrError] = BadText) -> bytes:
    """A regular file's bytes, at most ``max_bytes``; anything else is refused with ``error``.

    Opened without blocking and checked before any read: a FIFO with no writer once held `dgr verify`
    in open() forever, and a device (``--key /dev/zero``) never ends.  OSError is the caller's."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a plain file")
            raise error(f"{path} is not a regular file ({kind}); refusing to read it")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{path} is larger than {max_bytes} bytes; refusing to read it")
    return data


def read_json(path: Path, *, signed: bool = False, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read a JSON file through the bounded reader.  OSError (missing, unreadable) is the caller's."""
    data = read_bounded(path, max_bytes=max_bytes, error=BadSignedJson if signed else BadJson)
    return parse_json(data, source=str(path), signed=signed, max_bytes=max_bytes)


def read_text(path: Path, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """Read a text file under the encoding policy, bounded; raises BadText.  OSError is the caller's."""
    return decode_text(read_bounded(path, max_bytes=max_bytes), source=str(path))
