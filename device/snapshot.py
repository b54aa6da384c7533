"""The project as committed: ``git archive HEAD`` unpacked into the bundle.

Only the commit travels; edits not committed stay behind.  A checkout whose tracked files differ from
HEAD is refused unless the caller allows it, and then the paths that differ are named (printed and
written into the bundle manifest), so nobody takes the bundle for the working tree.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from core import proc
from core.errors import ConfigurationError


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    commit: str
    dirty: tuple[str, ...]  # tracked paths whose working copy differs from HEAD (not in the bundle)
    path: Path


def _git(repo: Path, env: Mapping[str, str], *args: str) -> str:
    return proc.run(["git", "-C", str(repo), *args], env=env).output


def head(repo: Path, env: Mapping[str, str]) -> str:
    return _git(repo, env, "rev-parse", "--verify", "HEAD^{commit}").strip()


def changed_paths(repo: Path, env: Mapping[str, str]) -> tuple[str, ...]:
    """Tracked paths with staged or unstaged changes (untracked files never reach `git archive`)."""
    out = _git(repo, env, "status", "--porcelain=v1", "--no-renames", "--untracked-files=no", "-z")
    return tuple(sorted(entry[3:] for entry in out.split("\0") if len(entry) > 3))


def export(
    repo: Path,
    dest: Path,
    env: Mapping[str, str],
    *,
    allow_dirty: bool = False,
    warn: Callable[[str], None] = print,
) -> Snapshot:
    """Unpack HEAD of ``repo`` into ``dest`` (which must not exist yet)."""
    commit = head(repo, env)
    dirty = changed_paths(repo, env)
    if dirty:
        listed = ", ".join(dirty[:8]) + (f" and {len(dirty) - 8} more" if len(dirty) > 8 else "")
        if not allow_dirty:
            raise ConfigurationError(
                f"the checkout has {len(dirty)} uncommitted change(s) ({listed}); the bundle carries "
                f"commit {commit[:12]} only",
                hint="commit (or set aside) the changes, or pass --allow-dirty to bundle HEAD anyway",
            )
        warn(
            f"device bundle: WARNING: {len(dirty)} uncommitted change(s) are NOT in the bundle, "
            f"which carries commit {commit[:12]}: {listed}"
        )
    dest.mkdir(parents=True)
    tarball = dest.parent / f".{dest.name}.tar"
    try:
        _git(repo, env, "archive", "--format=tar", f"--output={tarball}", commit)
        with tarfile.open(tarball, mode="r:") as tar:
            tar.extractall(dest, filter="data")
    finally:
        tarball.unlink(missing_ok=True)
    return Snapshot(commit=commit, dirty=dirty, path=dest)
