"""Git as a content hasher and exporter, isolated from the user's own git set-up.

The pinned tree id is the git tree id of the source as committed upstream.  The tree carries
.gitignore files that hide some committed files, so only a force-add (`git add -A -f`) reproduces
it.  Every call here uses a scratch GIT_DIR outside the tree (a `.git` is never created inside a
tree we own) and neutralises global/system config (core.autocrlf, core.excludesFile, ...) that
could change the result on someone else's machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from core import proc
from core.errors import IntegrityError

# Config that must not leak in from the user's set-up: it changes what `git add` hashes.
_NEUTRAL = (
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.filemode=true",
    "core.symlinks=true",
    "core.ignorecase=false",
    "core.precomposeunicode=false",
    "core.excludesFile=/dev/null",
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "gc.auto=0",
    "advice.detachedHead=false",
    "init.defaultBranch=main",
)

# Fixed identity and dates: commits we make (dev trees, tests) come out the same every run.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "dgr",
    "GIT_AUTHOR_EMAIL": "dgr@localhost",
    "GIT_COMMITTER_NAME": "dgr",
    "GIT_COMMITTER_EMAIL": "dgr@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def git_env(env: Mapping[str, str], **extra: str) -> dict[str, str]:
    """``env`` without inherited GIT_* steering, with global/system config switched off."""
    clean = {k: v for k, v in env.items() if not k.startswith("GIT_")}
    clean.update(
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_ASKPASS="/bin/true",
        GIT_OPTIONAL_LOCKS="0",
        LC_ALL="C",
    )
    clean.update(_IDENTITY)
    clean.update(extra)
    return clean


def git(args: list[str], *, env: Mapping[str, str], cwd: Path | None = None, **kwargs: object) -> str:
    """Run git with the neutral config; returns stripped combined output."""
    argv: list[str] = ["git"]
    for item in _NEUTRAL:
        argv += ["-c", item]
    return proc.run(argv + args, env=env, cwd=cwd, **kwargs).output.strip()  # type: ignore[arg-type]


# `git fetch --progress` prints steadily once connected: this long a silence means it is stuck.
FETCH_NO_OUTPUT_S = 30.0


def shallow_fetch(url: str, commit: str, *, env: Mapping[str, str], cwd: Path | None = None) -> None:
    """Fetch one commit, depth 1, no tags, over protocol v2, giving up on a stalled transfer."""
    git(
        [
            "-c",
            "http.lowSpeedLimit=1000",
            "-c",
            "http.lowSpeedTime=30",
            "-c",
            "protocol.version=2",
            "fetch",
            "--progress",
            "--no-tags",
            "--depth",
            "1",
            url,
            commit,
        ],
        env=env,
        cwd=cwd,
        no_output_timeout=FETCH_NO_OUTPUT_S,
    )


def init_scratch(parent: Path, env: Mapping[str, str], *, prefix: str = ".git-scratch-") -> Path:
    """A fresh bare repository used only as an object store + index, never inside a tree."""
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    git(["init", "-q", "--bare", str(scratch)], env=git_env(env))
    return scratch


def tree_id(tree: Path, env: Mapping[str, str], *, scratch_parent: Path | None = None) -> str:
    """Git tree id of the directory ``tree`` exactly as it is on disk (force-add of every file)."""
    tree = Path(os.path.abspath(tree))
    if (tree / ".git").exists():
        # A .git inside the tree would be taken as a submodule/gitlink and change the id.
        raise IntegrityError(
            f"{tree} contains a .git entry; a verified tree never has one",
            hint=f"remove {tree} and rerun the command that made it",
        )
    parent = scratch_parent or Path(tempfile.gettempdir())
    scratch = init_scratch(parent, env)
    try:
        genv = git_env(
            env, GIT_DIR=str(scratch), GIT_WORK_TREE=str(tree), GIT_INDEX_FILE=str(scratch / "dgr-index")
        )
        git(["add", "-A", "-f", "."], env=genv, cwd=tree)
        return git(["write-tree"], env=genv, cwd=tree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def export_tree(git_dir: Path, treeish: str, dest: Path, env: Mapping[str, str]) -> None:
    """Write the files of ``treeish`` into the empty directory ``dest`` (no attributes, no filters
    beyond plain checkout: `git archive` would honour export-ignore/export-subst and drop files)."""
    index = git_dir / "dgr-export-index"
    genv = git_env(env, GIT_DIR=str(git_dir), GIT_INDEX_FILE=str(index), GIT_WORK_TREE=str(dest))
    try:
        git(["read-tree", treeish], env=genv, cwd=dest)
        git(["checkout-index", "-a", "-f"], env=genv, cwd=dest)
    finally:
        index.unlink(missing_ok=True)


def tree_stamp(tree: Path) -> str:
    """Cheap identity of a tree on disk: a digest over (path, mode, size, mtime_ns) of every entry
    below it.  A walk of a few thousand lstat calls, no file contents read; any edit, touch, add or
    delete changes it, and then the tree id is recomputed (see STYLE 8)."""
    h = hashlib.sha256()
    root = os.path.abspath(tree)
    rows: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in sorted(filenames) + dirnames:  # dirs too: an added empty dir or .git shows up
            st = os.lstat(os.path.join(dirpath, name))
            rows.append(f"{rel}/{name}\0{st.st_mode:o}\0{st.st_size}\0{st.st_mtime_ns}")
    for row in rows:
        h.update(row.encode("utf-8", "surrogateescape") + b"\n")
    return f"{len(rows)}:{h.hexdigest()}"
