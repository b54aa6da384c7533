"""The patch-writer's loop: a git work tree with one commit per patch, and back to patch files.

`dgr patch --dev DIR` copies the pristine tree to DIR, commits it as "pristine <commit>", then
applies each patch of the series as its own commit (message = patch name + its description).
Edit, commit, rebase there with ordinary git.  `dgr patch --refresh DIR` turns every commit after
the base back into patches/NNNN-<slug>.patch (plain `git diff` of that commit, full blob ids, no
dates or commit hashes, so the bytes are the same every time) and rewrites patches/series.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from core.canonical import atomic_write_bytes, sha256_bytes
from core.context import Context
from core.errors import CommandFailed, ConfigurationError, IntegrityError
from core.workspace import PATCHES
from fetch import gittree
from fetch.source import Pin, ensure_pristine
from patches.stack import NAME, load_stack, read_series, write_series

# The flags patches are written with: the same bytes for the same commit on every machine.
DIFF = [
    "diff",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--full-index",
    "--binary",
    "--src-prefix=a/",
    "--dst-prefix=b/",
]


def describe(data: bytes) -> str:
    """The description in a patch's preamble: its '# ' lines after the name line."""
    lines: list[str] = []
    for ln in data.decode("utf-8", "replace").splitlines():
        if ln.startswith("diff --git "):
            break
        if ln.startswith("#"):
            lines.append(ln[2:] if ln.startswith("# ") else ln[1:])
    if lines and NAME.match(lines[0].strip()):
        lines = lines[1:]
    return "\n".join(lines).strip()


def slug_of(subject: str) -> str:
    m = re.match(r"^[0-9]{4}-(.+)\.patch$", subject.strip())
    raw = m[1] if m else subject
    slug = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:60].strip("-")
    if not slug:
        raise ConfigurationError(
            f"commit subject {subject!r} gives an empty patch name",
            hint="give the commit a short descriptive subject",
        )
    return slug


def dev_message(name: str, data: bytes) -> str:
    """A dev-tree commit message: the patch's name, then its description (what refresh reads back)."""
    about = describe(data)
    return name + ("\n\n" + about if about else "") + "\n"


def make_dev_tree(
    ctx: Context,
    dest: Path,
    *,
    pin: Pin | None = None,
    patches_dir: Path = PATCHES,
    message: Callable[[str, bytes], str] = dev_message,
    identity: Mapping[str, str] | None = None,
) -> str:
    """Create the dev work tree at ``dest``; returns the base commit id.  ``message`` gives each
    patch's commit message and ``identity`` the GIT_AUTHOR_*/GIT_COMMITTER_* of its commits (the
    upstream series uses both; the defaults are what ``refresh`` reads back)."""
    pristine = ensure_pristine(ctx, pin=pin)
    entries = read_series(patches_dir)
    contents = load_stack(entries, pristine.path)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigurationError(f"{dest} exists and is not empty", hint="pick a new directory")
    shutil.copytree(pristine.path, dest, symlinks=True, dirs_exist_ok=True)
    env = gittree.git_env(ctx.env)
    gittree.git(["init", "-q", str(dest)], env=env)
    gittree.git(["add", "-A", "-f"], env=env, cwd=dest)
    gittree.git(["commit", "-q", "--no-verify", "-m", f"pristine {pristine.commit}"], env=env, cwd=dest)
    base = gittree.git(["rev-parse", "HEAD"], env=env, cwd=dest)
    if gittree.git(["rev-parse", "HEAD^{tree}"], env=env, cwd=dest) != pristine.tree:
        raise IntegrityError(f"dev tree {dest}: base commit does not reproduce the pristine tree id")
    for entry, data in zip(entries, contents, strict=True):
        try:
            gittree.git(
                ["apply", "--index", "--whitespace=nowarn", "-p1", "-"], env=env, cwd=dest, stdin_data=data
            )
        except CommandFailed as exc:
            raise IntegrityError(f"patch {entry.name} does not apply in {dest}: {exc.message}") from None
        gittree.git(
            ["commit", "-q", "--no-verify", "--allow-empty", "-F", "-"],
            env={**env, **(identity or {})},
            cwd=dest,
            stdin_data=message(entry.name, data).encode("utf-8"),
        )
    return base


def refresh(
    ctx: Context, dev: Path, *, pin: Pin | None = None, patches_dir: Path = PATCHES
) -> list[tuple[str, str]]:
    """Regenerate the patch files and the series from the commits of ``dev``; returns (name, sha256)."""
    pristine = ensure_pristine(ctx, pin=pin)
    env = gittree.git_env(ctx.env)
    if not (dev / ".git").is_dir():
        raise ConfigurationError(f"{dev} is not a `dgr patch --dev` tree (no .git)")
    dirty = gittree.git(["status", "--porcelain", "--untracked-files=normal"], env=env, cwd=dev)
    if dirty:
        raise ConfigurationError(
            f"{dev} has uncommitted changes: {dirty.splitlines()[0]} ...",
            hint="commit or remove them, then refresh",
        )
    roots = gittree.git(["rev-list", "--max-parents=0", "HEAD"], env=env, cwd=dev).split()
    if len(roots) != 1:
        raise ConfigurationError(f"{dev}: expected one base commit, found {len(roots)}")
    base = roots[0]
    subject = gittree.git(["log", "-1", "--format=%s", base], env=env, cwd=dev)
    if (
        subject != f"pristine {pristine.commit}"
        or gittree.git(["rev-parse", f"{base}^{{tree}}"], env=env, cwd=dev) != pristine.tree
    ):
        raise ConfigurationError(f"{dev}: base commit is not the pristine tree of {pristine.commit}")
    if gittree.git(["rev-list", "--min-parents=2", f"{base}..HEAD"], env=env, cwd=dev):
        raise ConfigurationError(f"{dev}: merge commits cannot become patches", hint="rebase to a line")
    commits = gittree.git(["rev-list", "--reverse", f"{base}..HEAD"], env=env, cwd=dev).split()
    written: list[tuple[str, str, bytes]] = []
    with tempfile.TemporaryDirectory(prefix=".refresh-", dir=dev.parent) as tmp:
        for number, commit in enumerate(commits, 1):
            subject = gittree.git(["log", "-1", "--format=%s", commit], env=env, cwd=dev)
            body = gittree.git(["log", "-1", "--format=%b", commit], env=env, cwd=dev)
            name = f"{number:04d}-{slug_of(subject)}.patch"
            assert NAME.match(name), name
            out = Path(tmp) / name
            gittree.git([*DIFF, f"--output={out}", f"{commit}^", commit], env=env, cwd=dev)
            diff = out.read_bytes()
            if not diff:
                raise ConfigurationError(f"{dev}: commit {commit[:12]} ({subject}) changes nothing")
            head = "".join(f"# {line}".rstrip() + "\n" for line in [name, *body.strip().splitlines()])
            data = head.encode() + b"\n" + diff
            written.append((name, sha256_bytes(data), data))
    patches_dir.mkdir(parents=True, exist_ok=True)
    keep = {name for name, _, _ in written}
    for name, _, data in written:
        atomic_write_bytes(patches_dir / name, data)
    write_series(patches_dir, [(name, digest) for name, digest, _ in written])
    for old in patches_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"):
        if old.name not in keep:
            old.unlink()
    return [(name, digest) for name, digest, _ in written]
