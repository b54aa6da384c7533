"""Canonical JSON (sorted keys, no insignificant whitespace, UTF-8), digests and atomic writes, and the
one bounded JSON reader every file the tool reads goes through.

The reader refuses, with one line naming the file and the reason, what ``json.load`` would accept or
crash on: more than ``MAX_JSON_BYTES``, nesting deeper than ``MAX_JSON_DEPTH`` (``json`` recurses:
1000 nested arrays are a RecursionError), a duplicate key (``json`` keeps the last one silently),
``NaN`` / ``Infinity`` / a number that overflows to infinity, and text that is not UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, TypeGuard

from core.errors import ConfigurationError, IntegrityError
from core.hashing import digest_file

MAX_JSON_BYTES = 32 << 20  # the largest file we write is a certificate of a few hundred KiB
MAX_JSON_DEPTH = 64  # ours nest 8 deep at most


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


def is_json_object(value: object) -> TypeGuard[dict[str, Any]]:
    """A JSON object as the reader parses one: a dict whose keys are strings."""
    return isinstance(value, dict)


def is_json_array(value: object) -> TypeGuard[list[Any]]:
    """A JSON array as the reader parses one: a list."""
    return isinstance(value, list)


def _depth(value: Any) -> int:
    """Deepest nesting of arrays and objects, walked without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if is_json_object(item) or is_json_array(item):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if is_json_object(item) else item))
    return deepest


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
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite
        )
    except RecursionError:
        raise error(f"{source} is not valid JSON: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise error(f"{source} is not valid JSON: {exc}") from None
    if _depth(value) > max_depth:
        raise error(f"{source} is not valid JSON: nested deeper than {max_depth} levels")
    return value


def read_json(path: Path, *, signed: bool = False, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read a JSON file through the bounded reader.  OSError (missing, unreadable) is the caller's."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    return parse_json(data, source=str(path), signed=signed, max_bytes=max_bytes)
