"""The refresh flow for a new pin: the patch stack replayed onto a candidate llama.cpp commit.

`dgr patch --rebase-onto COMMIT` builds a git repository whose root is the pinned pristine tree with
one commit per patch (``make_dev_tree``), brings the candidate commit's tree into the same object
store (fetched from a git mirror, or imported from a directory holding that commit's tree), checks
it out and replays the series onto it patch by patch, each judged in this order:

- ``clean``: `git apply --check` passes without a merge (hunks found at their place or moved by an
  offset, which is recorded; never fuzz);
- ``3-way``: only `git apply --3way` applies it, and without a conflict (a context line moved or
  changed; the preimage blobs come from the pin's commits in the same repository);
- ``upstream``: the 3-way merge leaves nothing to change (the candidate already has the patch's
  changes); it is dropped from the refreshed series and the later patches are renumbered;
- ``conflict``: the 3-way merge leaves conflict markers (or git cannot merge at all); the files are
  named, the patch is left out and the later patches are judged without it.

When nothing conflicts the refreshed series (each patch's own preamble, then `git diff` of its
replayed commit with the same flags as ``dgr patch --refresh``, so the bytes match when nothing
moved) is written into the output directory with its ``series``; ``rebase.json`` records every
outcome either way.  The candidate is the root commit "pristine <commit>" of the branch the patches
are replayed on, as `dgr patch --dev` makes it, so with a conflict the repository kept there
(``tree/``) is a dev tree for the candidate: branch ``judged`` holds every patch that applied, and
``rebased`` stops at the first conflict with its markers in place.  The checkout's ``patches/`` is
only written when asked (``write_patches=True``) and only when nothing conflicts.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.canonical import atomic_write_bytes, sha256_bytes, write_json
from core.clock import utc_now
from core.context import Context
from core.errors import CommandFailed, CommandTimeout, ConfigurationError, IntegrityError, ToolchainMissing
from core.hashing import digest_fd
from core.locks import lock_file
from core.redact import redact_url
from core.workspace import PATCHES, refuse_links_below, sweep_leftovers
from fetch import archive, gittree
from fetch.source import (
    Pin,
    SourceUnavailable,
    ensure_pristine,
    git_url,
    load_pin,
    pip_download,
)
from patches.dev import DIFF, describe, make_dev_tree
from patches.stack import PatchEntry, load_stack, read_series, touched_paths, write_series

SCHEMA_VERSION = 1
COMMIT = re.compile(r"^[0-9a-f]{40}$")
CLEAN, THREE_WAY, UPSTREAM, CONFLICT = "clean", "3-way", "upstream", "conflict"
_APPLY = ["apply", "--whitespace=nowarn", "-p1"]
_CHECKING = re.compile(r"^Checking patch (.+)\.\.\.$")
_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)\.$")
_ERROR_PATH = re.compile(r"^error: (?:patch failed: )?([^:\s]+)(?::\d+)?: ")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One patch of the series on the candidate."""

    name: str  # its name in patches/series
    status: str  # clean | 3-way | upstream | conflict
    files: tuple[str, ...]  # the paths it touches
    conflicts: tuple[str, ...] = ()  # files git could not merge
    offsets: tuple[str, ...] = ()  # "path: hunk #N at line L (offset K)" for a clean patch that moved
    detail: str = ""  # git's own last words for a conflict
    refreshed: str | None = None  # its name in the refreshed series
    sha256: str | None = None  # of the refreshed file


@dataclass(frozen=True, kw_only=True)
class Rebase:
    pin: Pin
    candidate: str  # the commit asked for
    candidate_tree: str  # git tree id of what was replayed onto
    source: str  # where the candidate's tree came from (git URL, redacted, or a directory)
    outcomes: tuple[Outcome, ...]
    out: Path  # the output directory
    series_written: bool
    kept_tree: Path | None  # the repository, kept when something conflicts

    @property
    def ok(self) -> bool:
        return all(o.status != CONFLICT for o in self.outcomes)

    def record(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "dgr.rebase",
            "pin": {"commit": self.pin.commit, "tree": self.pin.tree},
            "candidate": {"commit": self.candidate, "tree": self.candidate_tree, "source": self.source},
            "patches": [
                {
                    "name": o.name,
                    "status": o.status,
                    "files": list(o.files),
                    "conflicts": list(o.conflicts),
                    "offsets": list(o.offsets),
                    "detail": o.detail,
                    "refreshed": o.refreshed,
                    "sha256": o.sha256,
                }
                for o in self.outcomes
            ],
            "series_written": self.series_written,
            "kept_tree": self.kept_tree.name if self.kept_tree else None,
        }


def default_out(ctx: Context, commit: str) -> Path:
    return ctx.workspace.root / "rebase" / commit[:12]


def rebase_onto(
    ctx: Context,
    commit: str,
    *,
    from_git: str | None = None,
    tree: Path | None = None,
    sdist: str | None = None,
    out: Path | None = None,
    pin: Pin | None = None,
    patches_dir: Path = PATCHES,
    write_patches: bool = False,
    download: Any = pip_download,
) -> Rebase:
    """Replay ``patches_dir``'s series onto ``commit``; the candidate's tree comes from ``tree`` (a
    directory holding it), or ``sdist`` (a llama-cpp-python sdist file, or a version of it fetched
    from the package index, whose vendored llama.cpp the user says is ``commit``), else from the git
    repository ``from_git`` (URL or local path), else from ``DGR_LLAMA_GIT_URL`` or the pin's upstream."""
    if not COMMIT.match(commit):
        raise ConfigurationError(
            f"--rebase-onto {commit!r} is not a 40-hex commit id",
            hint="name the candidate llama.cpp commit in full",
        )
    if sum(x is not None for x in (tree, sdist, from_git)) > 1:
        raise ConfigurationError("name one source of the candidate: --tree, --sdist or --from-git")
    if tree is not None and not tree.is_dir():
        raise ConfigurationError(f"--tree {tree} is not a directory")
    pin = pin or load_pin()
    out = Path(os.path.abspath(out or default_out(ctx, commit)))
    if _under(out, ctx.workspace.root):
        ctx.workspace.ensure(out.parent)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    refuse_links_below(out.parent, out)
    with lock_file(out.parent / f".{out.name}.lock"):
        sweep_leftovers(out.parent, f".{out.name}.tmp-*")
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            where = None
            if sdist is not None:
                tree, where = _sdist_tree(ctx, sdist, pin, work, download)
            result = _replay(
                ctx, commit, pin, patches_dir, work, out, from_git=from_git, tree=tree, where=where
            )
            if out.exists():
                shutil.rmtree(out)
            work.chmod(0o755)
            os.rename(work, out)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    if write_patches and result.ok:
        install_series(out / "patches", patches_dir)
    return result


def _replay(
    ctx: Context,
    commit: str,
    pin: Pin,
    patches_dir: Path,
    work: Path,
    out: Path,
    *,
    from_git: str | None,
    tree: Path | None,
    where: str | None,
) -> Rebase:
    repo = work / "tree"
    env = gittree.git_env(ctx.env)
    make_dev_tree(ctx, repo, pin=pin, patches_dir=patches_dir)
    entries = read_series(patches_dir)
    originals = load_stack(entries, ensure_pristine(ctx, pin=pin).path)
    candidate_tree, source = _candidate(
        ctx, repo, commit, pin, env, from_git=from_git, tree=tree, where=where
    )
    # The candidate as `dgr patch --dev` would have made it once the pin names it: one root commit
    # "pristine <commit>" (the pin's commits stay in the object store for the 3-way merges), so the
    # kept repository becomes a dev tree that `dgr patch --refresh` reads after the pin moves.
    root = gittree.git(["commit-tree", candidate_tree, "-m", f"pristine {commit}"], env=env, cwd=repo)
    gittree.git(["checkout", "-q", "-B", "rebased", root], env=env, cwd=repo)
    load_stack(entries, repo)  # the paths judged again on the candidate (a path now through a link)
    outcomes: list[Outcome] = []
    stop: tuple[str, PatchEntry, bytes] | None = None  # HEAD before the first conflict, and its patch
    for entry, data in zip(entries, originals, strict=True):
        before = gittree.git(["rev-parse", "HEAD"], env=env, cwd=repo)
        outcomes.append(_one(repo, entry, data, env))
        if outcomes[-1].status == CONFLICT and stop is None:
            stop = (before, entry, data)
    outcomes = _write_refreshed(
        repo,
        root,
        outcomes,
        dict(zip((e.name for e in entries), originals, strict=True)),
        work / "patches",
        env,
    )
    if stop is None:
        shutil.rmtree(repo)
    else:
        _leave_at_conflict(repo, *stop, env)
    result = Rebase(
        pin=pin,
        candidate=commit,
        candidate_tree=candidate_tree,
        source=source,
        outcomes=tuple(outcomes),
        out=out,
        series_written=stop is None,
        kept_tree=None if stop is None else out / "tree",
    )
    write_json(work / "rebase.json", dict(result.record(), created_at=utc_now()))
    return result


def _candidate(
    ctx: Context,
    repo: Path,
    commit: str,
    pin: Pin,
    env: Mapping[str, str],
    *,
    from_git: str | None,
    tree: Path | None,
    where: str | None,
) -> tuple[str, str]:
    """The candidate's git tree id in ``repo`` and where it came from: an extracted tree imported (and
    removed when it was the sdist's), or the commit fetched from git."""
    if tree is None:
        return _fetch(repo, commit, from_git, pin, ctx.env, env)
    candidate_tree = _import_tree(repo, tree, env)
    source = where or str(Path(os.path.abspath(tree)))
    if where is not None:
        shutil.rmtree(tree)  # the extracted sdist: its objects are in the repository now
    return candidate_tree, source


def _leave_at_conflict(
    repo: Path, before: str, entry: PatchEntry, data: bytes, env: Mapping[str, str]
) -> None:
    """The kept repository for the patch-writer: branch ``judged`` holds every patch that applied;
    ``rebased`` is reset to just before the first conflict, with that patch applied 3-way (conflict
    markers in the files, the patch's message ready for a plain `git commit`).  After resolving:
    `git commit`, `git cherry-pick HEAD..judged`, move the pin, `dgr patch --refresh`."""
    gittree.git(["branch", "-f", "judged", "HEAD"], env=env, cwd=repo)
    gittree.git(["reset", "-q", "--hard", before], env=env, cwd=repo)
    try:
        gittree.git([*_APPLY, "--3way", "--index", "-"], env=env, cwd=repo, stdin_data=data)
    except CommandFailed:
        pass  # the conflict, as judged: its markers are what the patch-writer resolves
    (repo / ".git" / "MERGE_MSG").write_text(_message(entry, data), encoding="utf-8")


# --- the candidate's tree ------------------------------------------------------------------------
def _import_tree(repo: Path, tree: Path, env: Mapping[str, str]) -> str:
    """The git tree id of the directory ``tree`` as it is on disk (force-add, like the pin's tree id),
    its objects written into the repository's own store."""
    tree = Path(os.path.abspath(tree))
    if (tree / ".git").exists():
        raise ConfigurationError(
            f"--tree {tree} contains a .git entry",
            hint="export the commit's files (git archive / worktree without .git)",
        )
    index = repo / ".git" / "dgr-candidate-index"
    genv = dict(env, GIT_DIR=str(repo / ".git"), GIT_WORK_TREE=str(tree), GIT_INDEX_FILE=str(index))
    try:
        gittree.git(["add", "-A", "-f", "."], env=genv, cwd=tree)
        return gittree.git(["write-tree"], env=genv, cwd=tree)
    finally:
        index.unlink(missing_ok=True)


def _sdist_tree(ctx: Context, sdist: str, pin: Pin, work: Path, download: Any) -> tuple[Path, str]:
    """The vendored llama.cpp of a llama-cpp-python sdist (a file, or a version fetched with pip),
    extracted under the pin's caps into ``work/candidate``; returns it and a description naming the
    sdist's sha256 (nothing vouches for it yet: the report records it for the next pin)."""
    sd = pin.sources.sdist
    given = Path(sdist)
    if given.is_file():
        path = Path(os.path.abspath(given))
    else:
        if not re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", sdist):
            raise ConfigurationError(f"--sdist {sdist!r} is neither a file nor a version of {sd.package}")
        got = work / "sdist"
        got.mkdir()
        want = replace(pin, sources=replace(pin.sources, sdist=replace(sd, version=sdist)))
        try:
            download(ctx, want, got)
        except (CommandFailed, CommandTimeout, ToolchainMissing) as exc:
            raise SourceUnavailable(
                f"sdist {sd.package}=={sdist}: download failed: {exc.message}",
                hint="give the sdist file, or the commit's files with --tree DIR",
            ) from None
        found = sorted(p for p in got.iterdir() if p.name.endswith(".tar.gz") and p.is_file())
        if len(found) != 1:
            raise SourceUnavailable(f"sdist {sd.package}=={sdist}: download gave {[p.name for p in found]}")
        path = found[0]
    if not path.name.endswith(".tar.gz"):
        raise ConfigurationError(f"--sdist {path} is not a .tar.gz sdist")
    dest = work / "candidate"
    dest.mkdir()
    with open(path, "rb") as fh:
        digest = digest_fd(fh.fileno(), sha256=True, blake3=False).sha256
        fh.seek(0)
        archive.extract_subtree(
            path,
            f"{path.name[: -len('.tar.gz')]}/{sd.subtree}",
            dest,
            archive.Caps(max_members=sd.max_members, max_bytes=sd.max_bytes),
            where=f"sdist {path.name}",
            drop=(".git",),
            fileobj=fh,
        )
    shutil.rmtree(work / "sdist", ignore_errors=True)
    return dest, f"sdist {path.name} sha256 {digest}"


def _fetch(
    repo: Path,
    commit: str,
    from_git: str | None,
    pin: Pin,
    user_env: Mapping[str, str],
    env: Mapping[str, str],
) -> tuple[str, str]:
    url = from_git or git_url(pin, user_env)
    if from_git is not None and Path(from_git).is_dir():
        url = Path(os.path.abspath(from_git)).as_uri()  # file:// so --depth is honoured
    where = f"git source {redact_url(url)}"
    try:
        gittree.shallow_fetch(url, commit, env=env, cwd=repo)
        got = gittree.git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], env=env, cwd=repo)
    except (CommandFailed, CommandTimeout, ToolchainMissing) as exc:
        tail = exc.tail.strip() if isinstance(exc, CommandFailed) else ""
        last = tail.splitlines()[-1] if tail else exc.message
        raise SourceUnavailable(
            f"{where}: could not fetch {commit}: {last}",
            hint="name a mirror with --from-git URL|DIR or DGR_LLAMA_GIT_URL, "
            "or the commit's files with --tree DIR",
        ) from None
    if got != commit:
        raise IntegrityError(f"{where}: asked for {commit}, got {got}")
    return gittree.git(["rev-parse", f"{commit}^{{tree}}"], env=env, cwd=repo), redact_url(url)


# --- one patch -----------------------------------------------------------------------------------
def _one(repo: Path, entry: PatchEntry, data: bytes, env: Mapping[str, str]) -> Outcome:
    files = tuple(dict.fromkeys(touched_paths(data, entry.name)))
    try:
        said = gittree.git([*_APPLY, "--check", "--verbose", "-"], env=env, cwd=repo, stdin_data=data)
    except CommandFailed:
        return _three_way(repo, entry, data, files, env)
    gittree.git([*_APPLY, "--index", "-"], env=env, cwd=repo, stdin_data=data)
    _commit(repo, entry, data, env)
    return Outcome(name=entry.name, status=CLEAN, files=files, offsets=offsets(said))


def _three_way(
    repo: Path, entry: PatchEntry, data: bytes, files: tuple[str, ...], env: Mapping[str, str]
) -> Outcome:
    try:
        gittree.git([*_APPLY, "--3way", "--index", "-"], env=env, cwd=repo, stdin_data=data)
    except CommandFailed as exc:
        unmerged = gittree.git(["ls-files", "-u", "-z"], env=env, cwd=repo)
        named = tuple(dict.fromkeys(row.split("\t", 1)[1] for row in unmerged.split("\0") if "\t" in row))
        if not named:  # git could not even merge (a file gone, a blob missing): the paths it names
            named = tuple(dict.fromkeys(m[1] for ln in exc.tail.splitlines() if (m := _ERROR_PATH.match(ln))))
        said = [
            ln.strip()
            for ln in exc.tail.splitlines()
            if ln.startswith("error: ") or ln.endswith("with conflicts.")
        ]
        last = "; ".join(dict.fromkeys(said)) or (exc.tail.strip().splitlines() or ["no output"])[-1]
        gittree.git(["reset", "-q", "--hard", "HEAD"], env=env, cwd=repo)  # our own scratch repository
        gittree.git(["clean", "-q", "-f", "-d", "-x"], env=env, cwd=repo)
        return Outcome(name=entry.name, status=CONFLICT, files=files, conflicts=named or files, detail=last)
    if not gittree.git(["diff", "--cached", "--name-only"], env=env, cwd=repo):
        return Outcome(name=entry.name, status=UPSTREAM, files=files)
    _commit(repo, entry, data, env)
    return Outcome(name=entry.name, status=THREE_WAY, files=files)


def _message(entry: PatchEntry, data: bytes) -> str:
    """What `dgr patch --dev` names a patch's commit (and `--refresh` reads back)."""
    about = describe(data)
    return entry.name + ("\n\n" + about if about else "") + "\n"


def _commit(repo: Path, entry: PatchEntry, data: bytes, env: Mapping[str, str]) -> None:
    gittree.git(
        ["commit", "-q", "--no-verify", "-F", "-"],
        env=env,
        cwd=repo,
        stdin_data=_message(entry, data).encode("utf-8"),
    )


def offsets(verbose: str) -> tuple[str, ...]:
    """The moved hunks in `git apply --verbose` output, as "path: hunk #N at line L (offset K)"."""
    found: list[str] = []
    path = "?"
    for line in verbose.splitlines():
        if m := _CHECKING.match(line):
            path = m[1]
        elif m := _OFFSET.match(line):
            found.append(f"{path}: hunk #{m[1]} at line {m[2]} (offset {int(m[3]):+d})")
    return tuple(found)


# --- the refreshed series ------------------------------------------------------------------------
def preamble(data: bytes) -> bytes:
    """A patch's bytes before its first `diff --git` line (name, description, the blank line)."""
    at = 0 if data.startswith(b"diff --git ") else data.find(b"\ndiff --git ") + 1
    return data[:at] if at > 0 else b""


def renamed(head: bytes, old: str, new: str) -> bytes:
    """The preamble with its name line following a renumbering."""
    first, sep, rest = head.partition(b"\n")
    if old != new and first.strip() == f"# {old}".encode():
        return f"# {new}".encode() + sep + rest
    return head


def _write_refreshed(
    repo: Path,
    candidate: str,
    outcomes: list[Outcome],
    originals: Mapping[str, bytes],
    dest: Path,
    env: Mapping[str, str],
) -> list[Outcome]:
    """The refreshed files of the patches that applied, commit by commit after ``candidate``, and
    their series; nothing when one conflicts."""
    commits = gittree.git(["rev-list", "--reverse", f"{candidate}..HEAD"], env=env, cwd=repo).split()
    kept = [o for o in outcomes if o.status in (CLEAN, THREE_WAY)]
    assert len(commits) == len(kept), (commits, kept)
    if any(o.status == CONFLICT for o in outcomes):
        return outcomes  # no series, so no new names: the conflicting patch is not dropped, only unsolved
    dest.mkdir()
    done: dict[str, Outcome] = {}
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix=".diff-", dir=repo.parent) as tmp:
        for number, (outcome, commit) in enumerate(zip(kept, commits, strict=True), 1):
            name = f"{number:04d}-{outcome.name.split('-', 1)[1]}"
            diff = Path(tmp) / name
            gittree.git([*DIFF, f"--output={diff}", f"{commit}^", commit], env=env, cwd=repo)
            data = renamed(preamble(originals[outcome.name]), outcome.name, name) + diff.read_bytes()
            digest = sha256_bytes(data)
            done[outcome.name] = replace(outcome, refreshed=name, sha256=digest)
            rows.append((name, digest))
            atomic_write_bytes(dest / name, data)
    write_series(dest, rows)
    return [done.get(o.name, o) for o in outcomes]


def install_series(src: Path, patches_dir: Path) -> None:
    """Copy a refreshed series over ``patches_dir`` (the explicit --write-patches): the new files,
    then the series, then the stale files removed."""
    entries = read_series(src)
    for entry in entries:
        atomic_write_bytes(patches_dir / entry.name, entry.path.read_bytes())
    atomic_write_bytes(patches_dir / "series", (src / "series").read_bytes())
    keep = {e.name for e in entries}
    for old in patches_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"):
        if old.name not in keep:
            old.unlink()


def table(result: Rebase) -> str:
    """One line per patch: name, status, the files (the conflicting ones for a conflict)."""
    width = max([len(o.name) for o in result.outcomes] + [5])
    lines = [f"{'patch':<{width}}  {'status':<8}  files"]
    for o in result.outcomes:
        where = o.conflicts if o.status == CONFLICT else o.files
        note = f"  [{'; '.join(o.offsets)}]" if o.offsets else ""
        moved = f" -> {o.refreshed}" if o.refreshed and o.refreshed != o.name else ""
        lines.append(f"{o.name:<{width}}  {o.status:<8}  {', '.join(where)}{note}{moved}")
    return "\n".join(lines)


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True
