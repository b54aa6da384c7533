"""The pristine llama.cpp tree at the pinned commit, from the first source that verifies.

Sources, in the pin's order (``DGR_FETCH_SOURCES=git,sdist`` narrows or reorders them):
- git: shallow fetch of the pinned commit (``DGR_LLAMA_GIT_URL`` points at a mirror), its tree id
  must equal the pin;
- sdist: the llama-cpp-python sdist from the package index (kept in the cross-workspace archive
  cache, sha256 checked before every use), only ``vendor/llama.cpp`` extracted, tree id checked.

A source that cannot be reached (no network, no such commit) hands over to the next one.  A source
that delivers something that does not verify stops everything with an IntegrityError: its bytes are
never used and no other copy is trusted in its place without its own check.

Everything lands in a fresh temp directory beside the final path, is verified, and is renamed into
place; the provenance record is written before the rename, so a record without a tree means
"unfinished" and a verified tree is never left without its record.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from core import proc
from core.canonical import read_json, write_json
from core.clock import utc_now
from core.context import Context
from core.errors import (
    CommandFailed,
    CommandTimeout,
    ConfigurationError,
    DgrError,
    IntegrityError,
    RuntimeFailure,
    ToolchainMissing,
)
from core.hashing import digest_fd
from core.locks import lock_file
from core.redact import redact_url
from core.workspace import MANIFESTS, refuse_links_below, sweep_leftovers
from fetch import archive, gittree
from manifests.loader import build, load_json

PROVENANCE_VERSION = 1
SOURCES = ("git", "sdist")
PIP_NO_OUTPUT_S = 300.0


@dataclass(frozen=True, kw_only=True)
class SdistPin:
    package: str
    version: str
    filename: str
    sha256: str
    subtree: str
    max_members: int = 20000
    max_bytes: int = 1 << 30


@dataclass(frozen=True, kw_only=True)
class SourcesPin:
    order: tuple[str, ...]
    sdist: SdistPin


@dataclass(frozen=True, kw_only=True)
class Pin:
    schema_version: int
    upstream: str
    commit: str
    tree: str
    sources: SourcesPin

    @property
    def short(self) -> str:
        return self.commit[:12]


@dataclass(frozen=True, kw_only=True)
class Pristine:
    path: Path
    provenance: Mapping[str, Any]
    provenance_path: Path

    @property
    def tree(self) -> str:
        return str(self.provenance["tree"])

    @property
    def commit(self) -> str:
        return str(self.provenance["commit"])


class SourceUnavailable(RuntimeFailure):
    """This source cannot deliver (no network, no such commit, tool missing): try the next."""


def load_pin(path: Path | None = None) -> Pin:
    path = path or MANIFESTS / "llama.cpp.json"
    pin: Pin = build(Pin, load_json(path, "llama.cpp"))
    parts = pin.sources.sdist.subtree.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ConfigurationError(f"{path}: /sources/sdist/subtree must be a plain relative path")
    return pin


def tree_dir(ctx: Context, pin: Pin) -> Path:
    return ctx.workspace.sources / f"llama.cpp-{pin.short}"


def provenance_file(ctx: Context, pin: Pin) -> Path:
    return ctx.workspace.sources / f"llama.cpp-{pin.short}.provenance.json"


def source_order(pin: Pin, env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("DGR_FETCH_SOURCES", "").strip()
    if not raw:
        return pin.sources.order
    order = tuple(s.strip() for s in raw.split(",") if s.strip())
    unknown = [s for s in order if s not in SOURCES]
    if unknown or not order:
        raise ConfigurationError(
            f"DGR_FETCH_SOURCES={raw!r}: unknown source {unknown}",
            hint=f"use a comma list of {', '.join(SOURCES)}",
        )
    return order


# --- entry point ---------------------------------------------------------------------------------
def ensure_pristine(ctx: Context, *, pin: Pin | None = None, reverify: bool = False) -> Pristine:
    """The verified pristine tree, fetched when absent; a fast no-op when already in place."""
    pin = pin or load_pin()
    final = tree_dir(ctx, pin)
    record = provenance_file(ctx, pin)
    ctx.workspace.ensure(ctx.workspace.sources)
    refuse_links_below(ctx.workspace.root, final)
    existing = _existing(ctx, pin, final, record, reverify=reverify)
    if existing is not None:
        return existing
    with lock_file(ctx.workspace.sources / f".llama.cpp-{pin.short}.lock"):
        existing = _existing(ctx, pin, final, record, reverify=reverify)
        if existing is not None:
            return existing
        sweep_leftovers(final.parent, f".{final.name}.tmp-*")
        return _fetch(ctx, pin, final, record)


def _existing(ctx: Context, pin: Pin, final: Path, record: Path, *, reverify: bool) -> Pristine | None:
    if not final.exists():
        return None
    if not record.is_file():
        raise IntegrityError(
            f"{final} exists without its provenance record; it was not put there by `dgr fetch`",
            hint=f"remove {final} and rerun `dgr fetch`",
        )
    try:
        prov = read_json(record)
    except (OSError, ValueError):
        prov = None
    if not (
        isinstance(prov, dict)
        and prov.get("schema_version") == PROVENANCE_VERSION
        and prov.get("commit") == pin.commit
        and prov.get("tree") == pin.tree
    ):
        raise IntegrityError(
            f"{record} does not describe the pinned tree {pin.tree}",
            hint=f"remove {final} and its record, then rerun `dgr fetch`",
        )
    stamp = gittree.tree_stamp(final)
    if stamp == prov.get("stamp") and not reverify:
        return Pristine(path=final, provenance=prov, provenance_path=record)
    actual = gittree.tree_id(final, ctx.env, scratch_parent=ctx.workspace.sources)
    if actual != pin.tree:
        raise IntegrityError(
            f"pristine tree {final} was modified: tree id {actual}, pin {pin.tree}",
            hint=f"remove {final} and rerun `dgr fetch`; edit patches in a `dgr patch --dev` tree instead",
        )
    prov = dict(prov, stamp=stamp, reverified_at=utc_now())
    write_json(record, prov)
    return Pristine(path=final, provenance=prov, provenance_path=record)


def _fetch(ctx: Context, pin: Pin, final: Path, record: Path) -> Pristine:
    attempts: list[dict[str, str]] = []
    for name in source_order(pin, ctx.env):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        started = time.monotonic()
        try:
            details = FETCHERS[name](ctx, pin, tmp)
            actual = gittree.tree_id(tmp, ctx.env, scratch_parent=final.parent)
            if actual != pin.tree:
                raise IntegrityError(
                    f"{name} source gave tree {actual}, the pin says {pin.tree}; nothing was installed"
                )
            prov = {
                "schema_version": PROVENANCE_VERSION,
                "kind": "dgr.source",
                "upstream": pin.upstream,
                "commit": pin.commit,
                "tree": actual,
                "source": name,
                **details,
                "attempts": attempts + [{"source": name, "outcome": "ok"}],
                "fetched_at": utc_now(),
                "seconds": round(time.monotonic() - started, 3),
                "path": final.name,
            }
            prov["stamp"] = gittree.tree_stamp(tmp)
            # The stamp covers mtimes, which survive the rename unchanged.
            write_json(record, prov)
            tmp.chmod(0o755)  # mkdtemp made it private; the tree is read by builds and people
            os.rename(tmp, final)
            return Pristine(path=final, provenance=prov, provenance_path=record)
        except SourceUnavailable as exc:
            attempts.append({"source": name, "outcome": "unavailable", "error": exc.message})
            print(f"dgr fetch: {name} source unavailable: {exc.message}", file=sys.stderr)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    tried = "; ".join(f"{a['source']}: {a.get('error', '')}" for a in attempts) or "none"
    raise RuntimeFailure(
        f"no source could provide llama.cpp {pin.commit} ({tried})",
        hint="check network access to the package index, or set DGR_LLAMA_GIT_URL to a mirror",
    )


# --- git -----------------------------------------------------------------------------------------
def git_url(pin: Pin, env: Mapping[str, str]) -> str:
    return env.get("DGR_LLAMA_GIT_URL", "").strip() or pin.upstream


def fetch_git(ctx: Context, pin: Pin, dest: Path) -> dict[str, Any]:
    """Shallow-fetch the pinned commit into a scratch object store; export its tree into ``dest``."""
    url = git_url(pin, ctx.env)
    where = f"git source {redact_url(url)}"
    scratch = gittree.init_scratch(dest.parent, ctx.env)
    env = gittree.git_env(ctx.env, GIT_DIR=str(scratch))
    try:
        try:
            gittree.shallow_fetch(url, pin.commit, env=env)
        except (CommandFailed, CommandTimeout, ToolchainMissing) as exc:
            raise SourceUnavailable(f"{where}: could not fetch {pin.commit}: {_why(exc)}") from None
        try:
            commit = gittree.git(["rev-parse", "--verify", "--quiet", f"{pin.commit}^{{commit}}"], env=env)
            tree = gittree.git(["rev-parse", "--verify", "--quiet", f"{pin.commit}^{{tree}}"], env=env)
        except CommandFailed:
            raise SourceUnavailable(f"{where}: commit {pin.commit} is not in what was fetched") from None
        if commit != pin.commit:
            raise IntegrityError(f"{where}: asked for {pin.commit}, got {commit}")
        if tree != pin.tree:
            raise IntegrityError(f"{where}: commit {pin.commit} has tree {tree}, the pin says {pin.tree}")
        gittree.export_tree(scratch, tree, dest, ctx.env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"git_url": redact_url(url), "archive": None}


# --- sdist ---------------------------------------------------------------------------------------
def archive_path(ctx: Context, pin: Pin) -> Path:
    return ctx.workspace.cache / "archives" / pin.sources.sdist.filename


def pip_download(ctx: Context, pin: Pin, into: Path) -> None:
    """The sdist from the package index, by the running interpreter's pip (no wheels, no deps)."""
    sd = pin.sources.sdist
    env = dict(ctx.env, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    proc.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            f"{sd.package}=={sd.version}",
            "-d",
            str(into),
        ],
        env=env,
        no_output_timeout=PIP_NO_OUTPUT_S,
    )


def obtain_archive(ctx: Context, pin: Pin, *, download: Any = pip_download) -> tuple[Path, bool]:
    """The verified sdist in the archive cache: (path, downloaded_now)."""
    fh, path, downloaded = open_archive(ctx, pin, download=download)
    fh.close()
    return path, downloaded


def open_archive(ctx: Context, pin: Pin, *, download: Any = pip_download) -> tuple[BinaryIO, Path, bool]:
    """The verified sdist in the archive cache, open at byte 0: (file, path, downloaded_now).

    The cache is shared with other workspaces, so the digest is taken over the open file and the
    caller reads from that same file: the bytes it reads are the bytes verified, whatever happens to
    the path meanwhile.  A cached copy is re-hashed before every use; a wrong one is deleted, never
    used.  A fresh download lands in a temp dir beside the cache entry and is only renamed in once it
    verifies (the open file keeps the same inode across the rename).
    """
    cached = archive_path(ctx, pin)
    ctx.workspace.ensure(cached.parent)
    fh = _open_cached(cached, pin.sources.sdist.sha256)
    if fh is not None:
        return fh, cached, False
    return _download_to_cache(ctx, pin, cached, download), cached, True


def _open_cached(cached: Path, sha256: str) -> BinaryIO | None:
    """The cached sdist, open and verified, or None.  The cache is shared with other workspaces, so it
    is hashed before every use; a copy with another digest is deleted here, never used."""
    if not cached.exists():
        return None
    fh = open(cached, "rb")  # handed to the caller, who closes it
    actual = _sha256_open(fh)
    if actual == sha256:
        return fh
    fh.close()
    print(
        f"dgr fetch: cached {cached} has sha256 {actual}, expected {sha256}; deleting it",
        file=sys.stderr,
    )
    cached.unlink()
    return None


def _download_to_cache(ctx: Context, pin: Pin, cached: Path, download: Any) -> BinaryIO:
    """A fresh download, into a temp dir beside the cache entry, renamed in only once it verifies;
    the file stays open across the rename, so the caller reads the very bytes that were hashed."""
    sd = pin.sources.sdist
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cached.parent))
    try:
        try:
            download(ctx, pin, tmp)
        except (CommandFailed, CommandTimeout, ToolchainMissing) as exc:
            raise SourceUnavailable(
                f"sdist {sd.package}=={sd.version}: download failed: {_why(exc)}"
            ) from None
        got = tmp / sd.filename
        if not got.is_file() or got.is_symlink():
            names = sorted(p.name for p in tmp.iterdir())
            raise SourceUnavailable(
                f"sdist {sd.package}=={sd.version}: download gave {names}, not {sd.filename}"
            )
        fh = open(got, "rb")  # handed to the caller, who closes it
        try:
            actual = _sha256_open(fh)
            if actual != sd.sha256:
                raise IntegrityError(
                    f"sdist {sd.package}=={sd.version} from the package index: sha256 "
                    f"{actual}, expected {sd.sha256}; the file was discarded"
                )
            os.replace(got, cached)
        except BaseException:
            fh.close()
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return fh


def _sha256_open(fh: BinaryIO) -> str:
    """sha256 of an open file from byte 0 (the one hasher, on its descriptor), leaving it at byte 0 for
    the reader. Hashing the descriptor the reader keeps means the bytes checked are the bytes read."""
    digest = digest_fd(fh.fileno(), sha256=True, blake3=False).sha256
    fh.seek(0)
    assert digest is not None
    return digest


def fetch_sdist(ctx: Context, pin: Pin, dest: Path, *, download: Any = pip_download) -> dict[str, Any]:
    sd = pin.sources.sdist
    fh, path, downloaded = open_archive(ctx, pin, download=download)
    top = sd.filename[: -len(".tar.gz")]
    with fh:  # hashed by open_archive: extract from this very file, not from the path again
        plan = archive.extract_subtree(
            path,
            f"{top}/{sd.subtree}",
            dest,
            archive.Caps(max_members=sd.max_members, max_bytes=sd.max_bytes),
            where=f"sdist {sd.filename}",
            drop=(".git",),
            fileobj=fh,
        )
    return {
        "archive": {
            "kind": "sdist",
            "package": sd.package,
            "version": sd.version,
            "filename": sd.filename,
            "sha256": sd.sha256,
            "subtree": sd.subtree,
            "downloaded": downloaded,
            "members_extracted": plan.files,
        },
        "git_url": None,
    }


FETCHERS = {"git": fetch_git, "sdist": fetch_sdist}


# --- small helpers -------------------------------------------------------------------------------
def _why(exc: DgrError) -> str:
    """The tool's own last words, not our long command line."""
    tail = getattr(exc, "tail", "").strip()
    return tail.splitlines()[-1] if tail else exc.message
