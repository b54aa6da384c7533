"""The numbered patch stack: read and verify patches/series, refuse unsafe patches, apply onto a copy.

The whole stack is judged before anything is applied (RELIABILITY 18): a digest mismatch, a gap in
the numbering, a path outside the tree, a path through or to a symlink, a symlink or gitlink being
created: refused, nothing written.  Applying happens in a fresh copy of the pristine tree beside the
final path with `git apply --check` then `git apply` per patch (never --unsafe-paths, never GNU
patch); only a fully applied, hashed tree is renamed into place.  The pristine tree is only read.

Modes: every mode a patch names (``new file mode``, ``deleted file mode``, ``old mode``, ``new mode``,
``index ... MODE``) is read as git reads it, as an octal number, and the patch is refused unless that
number is exactly 0100644 or 0100755 (a regular file); any other value, which git would turn into a
symbolic link (0120000 and every mode with the link bits), a gitlink, a directory, is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.canonical import (
    atomic_write_bytes,
    canonical_digest,
    read_json,
    read_text,
    sha256_bytes,
    write_json,
)
from core.clock import utc_now
from core.context import Context
from core.errors import CommandFailed, ConfigurationError, IntegrityError
from core.locks import lock_file
from core.workspace import PATCHES, refuse_links_below, sweep_leftovers
from fetch import gittree
from fetch.source import Pin, Pristine, ensure_pristine

PROVENANCE_VERSION = 1
NAME = re.compile(r"^(?P<num>[0-9]{4})-[a-z0-9][a-z0-9._-]*\.patch$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
SERIES_HEADER = """\
# dgr patch stack, applied in this order onto the pristine llama.cpp tree by `dgr patch`.
# One line per patch: `NNNN-name.patch <sha256 of that file>`, numbered 0001, 0002, ... without gaps.
# '#' starts a comment.  Written by `dgr patch --refresh DIR`; never edit a digest by hand.
"""
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_REGULAR_MODES = (0o100644, 0o100755)
_S_IFMT, _S_IFLNK, _S_IFDIR, _S_IFGITLINK = 0o170000, 0o120000, 0o040000, 0o160000


@dataclass(frozen=True, kw_only=True)
class PatchEntry:
    number: int
    name: str
    sha256: str
    path: Path


@dataclass(frozen=True, kw_only=True)
class Patched:
    path: Path
    digest: str  # git tree id of the patched tree (same force-add method as the pin's tree id)
    key: str  # derived from (pristine tree id, ordered patch digests); names the directory
    provenance: Mapping[str, Any]
    provenance_path: Path
    pristine: Pristine  # the verified tree it was made from (callers need not verify it again)


# --- series --------------------------------------------------------------------------------------
def read_series(patches_dir: Path = PATCHES) -> tuple[PatchEntry, ...]:
    series = patches_dir / "series"
    try:
        text = read_text(series)  # the one encoding policy: strict UTF-8, one line otherwise
    except FileNotFoundError:
        raise ConfigurationError(f"{series} does not exist", hint="an empty stack is an empty file") from None
    entries: list[PatchEntry] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not SHA256.match(fields[1]):
            raise ConfigurationError(f"{series}:{lineno}: expected `NNNN-name.patch <sha256>`, got {raw!r}")
        name, digest = fields
        m = NAME.match(name)
        if not m:
            raise IntegrityError(
                f"{series}:{lineno}: unsafe or malformed patch name {name!r}",
                hint="names look like 0001-short-slug.patch",
            )
        number = int(m["num"])
        expected = len(entries) + 1
        if number != expected:
            raise IntegrityError(
                f"{series}:{lineno}: {name} is number {number}, expected {expected:04d} "
                "(numbering must run 0001.. without gaps); the stack was refused"
            )
        entries.append(PatchEntry(number=number, name=name, sha256=digest, path=patches_dir / name))
    return tuple(entries)


def write_series(patches_dir: Path, entries: list[tuple[str, str]]) -> None:
    body = SERIES_HEADER + "".join(f"{name} {digest}\n" for name, digest in entries)
    atomic_write_bytes(patches_dir / "series", body.encode("utf-8"))


def load_stack(entries: tuple[PatchEntry, ...], tree: Path) -> tuple[bytes, ...]:
    """Every patch's bytes, each digest-checked and judged safe against ``tree``; all or nothing."""
    contents: list[bytes] = []
    for entry in entries:
        if entry.path.is_symlink() or not entry.path.is_file():
            raise IntegrityError(f"patch {entry.name} is missing or not a plain file; the stack was refused")
        data = entry.path.read_bytes()
        actual = sha256_bytes(data)
        if actual != entry.sha256:
            raise IntegrityError(
                f"patch {entry.name}: sha256 {actual}, series says {entry.sha256}; the stack was refused",
                hint="regenerate with `dgr patch --refresh DIR`",
            )
        for path in touched_paths(data, entry.name):
            _check_path(path, tree, entry.name)
        contents.append(data)
    return tuple(contents)


# --- judging a patch -----------------------------------------------------------------------------
def touched_paths(data: bytes, name: str) -> list[str]:
    """Every path a git-format patch names, read the way `git apply -p1` would; refuses symlink or
    gitlink modes and any old-style (non-git) header that would bypass our reading."""
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    paths: list[str] = []
    state = "between"  # between | header | hunk
    old = new = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if state == "hunk":
            if line.startswith("\\"):
                continue
            tag = line[:1]
            if tag in (" ", ""):
                old, new = old - 1, new - 1
            elif tag == "-":
                old -= 1
            elif tag == "+":
                new -= 1
            else:
                raise IntegrityError(f"patch {name}: malformed hunk line {i}: {line[:60]!r}")
            if old <= 0 and new <= 0:
                state = "between"
            continue
        if line.startswith("diff --git "):
            state = "header"
            paths += _git_line_paths(line[len("diff --git ") :], name)
            continue
        m = _HUNK.match(line)
        if m and paths:  # a hunk only counts after a git header
            old = int(m[1]) if m[1] is not None else 1
            new = int(m[2]) if m[2] is not None else 1
            state = "hunk" if (old or new) else "between"
            continue
        if state == "header":
            for key in ("rename from ", "rename to ", "rename old ", "rename new ", "copy from ", "copy to "):
                if line.startswith(key):
                    paths.append(_unquote(line[len(key) :]))
            if line.startswith(("--- ", "+++ ")):
                p = _unquote(line[4:].split("\t", 1)[0])
                if p != "/dev/null":
                    paths.append(_strip_p1(p, name))
            for key in ("new file mode ", "deleted file mode ", "old mode ", "new mode "):
                if line.startswith(key):
                    _check_mode(line[len(key) :].strip(), name)
            if line.startswith("index "):
                _check_index_mode(line[len("index ") :], name)
            continue
        # Outside any git header: an old-style header here would be applied by git, unseen by us.
        if line.startswith(("--- ", "+++ ", "*** ")) or m:
            raise IntegrityError(
                f"patch {name}: line {i} looks like a non-git diff header; only `git diff` output is accepted"
            )
    if state == "hunk":
        raise IntegrityError(f"patch {name}: ends inside a hunk (truncated?)")
    return paths


def git_mode(text: str) -> int | None:
    """The mode git's apply reads from ``text``: ``strtoul(text, &end, 8)`` stored in an unsigned int
    (older gits ignore what follows the digits, so we do too); None when there are no digits."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-7]+)", text)
    if m is None:
        return None
    value = int(m[2], 8)
    if value > 0xFFFFFFFFFFFFFFFF:
        return 0xFFFFFFFF  # strtoul saturates at ULONG_MAX
    return (-value if m[1] == "-" else value) & 0xFFFFFFFF


def _check_index_mode(rest: str, name: str) -> None:
    """``index OLD..NEW[ MODE]``: git reads a mode from whatever follows the first space after '..'."""
    dots = rest.find("..")
    space = rest.find(" ", dots + 2) if dots >= 0 else -1
    if space >= 0:
        _check_mode(rest[space + 1 :], name)


def _mode_kind(mode: int) -> str:
    kind = mode & _S_IFMT
    if kind == _S_IFLNK:
        return "a symbolic link"
    if kind == _S_IFDIR:
        return "a directory"
    if kind == 0o100000:
        return "a regular file with unusual permissions"
    return "a submodule (gitlink)"  # git's canon_mode makes every other type a gitlink


def _check_mode(text: str, name: str) -> None:
    mode = git_mode(text)
    if mode is None:
        raise IntegrityError(f"patch {name}: mode {text!r} is not an octal number; the stack was refused")
    if mode not in _REGULAR_MODES:
        raise IntegrityError(
            f"patch {name} creates or changes {_mode_kind(mode)} (mode {text.strip()}, "
            f"octal {mode:o}); only regular files 100644/100755 are accepted, "
            "the stack was refused"
        )


def _git_line_paths(rest: str, name: str) -> list[str]:
    if rest.startswith('"'):
        first, after = _take_quoted(rest)
        second = _unquote(after.strip())
        return [_strip_p1(first, name), _strip_p1(second, name)]
    # Unquoted: git splits where both sides name the same path ("a/P b/P"); a rename falls back to
    # its rename from/to lines, so judging every plausible split is the conservative reading.
    out = []
    for idx in [m.start() for m in re.finditer(" ", rest)]:
        left, right = rest[:idx], rest[idx + 1 :]
        if left[2:] == right[2:] or right.startswith("b/"):
            out += [_strip_p1(left, name), _strip_p1(_unquote(right), name)]
    if not out:
        raise IntegrityError(f"patch {name}: cannot read the header `diff --git {rest}`")
    return out


def _strip_p1(path: str, name: str) -> str:
    if path.startswith("/"):
        raise IntegrityError(
            f"patch {name}: path {path!r} is absolute; the stack was refused, nothing was changed"
        )
    if "/" not in path:
        raise IntegrityError(f"patch {name}: path {path!r} has no a/ or b/ prefix")
    return path.split("/", 1)[1]


_OCTAL_ESCAPE = re.compile(r"[0-3][0-7][0-7]")


def _take_quoted(s: str) -> tuple[str, str]:
    out = bytearray()
    i = 1
    escapes = {"n": 10, "t": 9, '"': 34, "\\": 92, "a": 7, "b": 8, "f": 12, "r": 13, "v": 11}
    while i < len(s):
        c = s[i]
        if c == '"':
            return out.decode("utf-8", "surrogateescape"), s[i + 1 :]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n in escapes:
                out.append(escapes[n])
                i += 2
                continue
            # git's unquote_c_style: three octal digits, the first 0-3; any other escape is bad quoting
            if not _OCTAL_ESCAPE.fullmatch(s[i + 1 : i + 4]):
                raise IntegrityError(f"bad quoting (\\{s[i + 1 : i + 4]!s}) in patch header: {s[:80]!r}")
            out.append(int(s[i + 1 : i + 4], 8))
            i += 4
            continue
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    raise IntegrityError(f"unterminated quoted path in patch header: {s[:80]!r}")


def _unquote(s: str) -> str:
    return _take_quoted(s)[0] if s.startswith('"') else s


def _check_path(path: str, tree: Path, name: str) -> None:
    why = None
    parts = path.split("/")
    if not path or path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        why = "is absolute"
    elif any(p in ("", ".", "..") for p in parts):
        why = "has an empty, '.' or '..' component"
    elif any(ord(c) < 32 or c == "\x7f" or c == "\\" for c in path):
        why = "has a control character or backslash"
    elif any(p.lower() == ".git" for p in parts):
        why = "points into a .git directory"
    else:
        probe = tree
        for part in parts:
            probe = probe / part
            if probe.is_symlink():
                why = f"goes through or to the symbolic link {'/'.join(probe.relative_to(tree).parts)}"
                break
    if why:
        raise IntegrityError(f"patch {name}: path {path!r} {why}; the stack was refused, nothing was changed")


# --- applying ------------------------------------------------------------------------------------
def stack_key(tree: str, entries: tuple[PatchEntry, ...]) -> str:
    return canonical_digest({"pristine_tree": tree, "patches": [e.sha256 for e in entries]})[:16]


def apply_stack(
    source: Path, contents: tuple[bytes, ...], dest: Path, env: Mapping[str, str], names: tuple[str, ...]
) -> None:
    """Copy ``source`` into the not-yet-existing ``dest`` and apply each patch there, checked first."""
    shutil.copytree(source, dest, symlinks=True)
    scratch = gittree.init_scratch(dest.parent, env)
    genv = gittree.git_env(env, GIT_DIR=str(scratch), GIT_WORK_TREE=str(dest))
    try:
        for name, data in zip(names, contents, strict=True):
            for check in (["--check"], []):
                try:
                    gittree.git(
                        ["apply", *check, "--whitespace=nowarn", "-p1", "-"],
                        env=genv,
                        cwd=dest,
                        stdin_data=data,
                    )
                except CommandFailed as exc:
                    last = exc.tail.strip().splitlines()[-1] if exc.tail.strip() else "no output"
                    raise IntegrityError(
                        f"patch {name} does not apply: {last}; the stack was refused",
                        hint="rebase it in a `dgr patch --dev DIR` tree",
                    ) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ensure_patched(
    ctx: Context, *, pin: Pin | None = None, patches_dir: Path = PATCHES, reverify: bool = False
) -> Patched:
    """The patched tree for the current series; a fast no-op when it already exists and verifies."""
    pristine = ensure_pristine(ctx, pin=pin)
    entries = read_series(patches_dir)
    contents = load_stack(entries, pristine.path)
    key = stack_key(pristine.tree, entries)
    root = ctx.workspace.patched
    ctx.workspace.ensure(root)
    final = root / key
    record = root / f"{key}.provenance.json"
    refuse_links_below(ctx.workspace.root, final)
    found = _existing(ctx, pristine, final, record, key, reverify=reverify)
    if found is not None:
        return found
    with lock_file(root / f".{key}.lock"):
        found = _existing(ctx, pristine, final, record, key, reverify=False)
        if found is not None:
            return found
        sweep_leftovers(root, f".{key}.tmp-*")
        sweep_leftovers(root, f".{key}.stale-*")
        return _build(ctx, pristine, entries, contents, final, record, key)


def _existing(
    ctx: Context, pristine: Pristine, final: Path, record: Path, key: str, *, reverify: bool
) -> Patched | None:
    if not final.exists():
        return None
    try:
        prov = read_json(record)
    except (OSError, ValueError):
        return None
    if not (
        isinstance(prov, dict) and prov.get("schema_version") == PROVENANCE_VERSION and prov.get("key") == key
    ):
        return None
    stamp = gittree.tree_stamp(final)
    if stamp == prov.get("stamp") and not reverify:
        return Patched(
            path=final,
            digest=prov["digest"],
            key=key,
            provenance=prov,
            provenance_path=record,
            pristine=pristine,
        )
    if gittree.tree_id(final, ctx.env, scratch_parent=final.parent) != prov.get("digest"):
        return None  # edited by hand: rebuilt from the pristine tree (it is derived data)
    prov = dict(prov, stamp=stamp, reverified_at=utc_now())
    write_json(record, prov)
    return Patched(
        path=final, digest=prov["digest"], key=key, provenance=prov, provenance_path=record, pristine=pristine
    )


def _build(
    ctx: Context,
    pristine: Pristine,
    entries: tuple[PatchEntry, ...],
    contents: tuple[bytes, ...],
    final: Path,
    record: Path,
    key: str,
) -> Patched:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=final.parent))
    tmp = work / "tree"
    try:
        apply_stack(pristine.path, contents, tmp, ctx.env, tuple(e.name for e in entries))
        digest = gittree.tree_id(tmp, ctx.env, scratch_parent=work)
        prov = {
            "schema_version": PROVENANCE_VERSION,
            "kind": "dgr.patched",
            "key": key,
            "pristine": {"commit": pristine.commit, "tree": pristine.tree, "path": str(pristine.path)},
            "patches": [{"number": e.number, "name": e.name, "sha256": e.sha256} for e in entries],
            "digest": digest,
            "stamp": gittree.tree_stamp(tmp),
            "created_at": utc_now(),
            "seconds": round(time.monotonic() - started, 3),
        }
        stale = None
        if final.exists():  # a hand-edited copy: moved aside in one rename, then removed
            stale = Path(tempfile.mkdtemp(prefix=f".{key}.stale-", dir=final.parent))
            os.rename(final, stale / "tree")
        write_json(record, prov)
        os.rename(tmp, final)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Patched(
        path=final, digest=digest, key=key, provenance=prov, provenance_path=record, pristine=pristine
    )
