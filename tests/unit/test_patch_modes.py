"""Issue 20 item 1: the patch judge reads modes as git does (octal numbers) and accepts regular files only.

Each spelling below is first handed to the real `git apply` in a scratch repository, to show what git
makes of it (a link, a gitlink, a directory entry, an error); the judge must refuse every one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from core.context import Context
from core.errors import IntegrityError
from patches.stack import SERIES_HEADER, ensure_patched, git_mode, touched_paths

# Mode spellings git reads as something other than a regular file (or refuses outright).
NOT_REGULAR = [
    "120000",
    "0120000",
    "00120000",
    "120777",
    "120644",
    "127777",
    "+120000",
    "120000junk",
    "100000120000",  # wraps to 0120000 in git's unsigned int
    "160000",
    "0160000",
    "160644",
    "040000",
    "40000",
    "040755",
    "644",
    "755",
    "0",
    "000000",
    "170000",
    "777777",
    "-1",
    "99999999999999999999999",
    "100600",
    "100777",
    "100000",  # regular, but not one of the two modes git itself writes
]
REGULAR = ["100644", "0100644", "100755", "0100755"]


def _new_file(mode: str, path: str = "evil-link") -> str:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
        "@@ -0,0 +1 @@\n+/tmp/outside\n\\ No newline at end of file\n"
    )


def _headers(mode: str) -> dict[str, str]:
    """The same mode in every header line git takes one from."""
    return {
        "new file mode": _new_file(mode),
        "new mode": f"diff --git a/README.md b/README.md\nold mode 100644\nnew mode {mode}\n",
        "old mode": f"diff --git a/README.md b/README.md\nold mode {mode}\nnew mode 100644\n",
        "deleted file mode": (
            f"diff --git a/README.md b/README.md\ndeleted file mode {mode}\n"
            "--- a/README.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-tiny upstream\n"
        ),
        "index": (
            "diff --git a/README.md b/README.md\n"
            f"index 1111111..2222222 {mode}\n--- a/README.md\n+++ b/README.md\n"
            "@@ -1 +1 @@\n-tiny upstream\n+tiny upstream!\n"
        ),
    }


def _git_makes(tmp_path: Path, mode: str) -> str:
    """What the real `git apply` creates from a new-file patch with this mode."""
    repo = tmp_path / f"git-{hashlib.sha256(mode.encode()).hexdigest()[:8]}"
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    done = subprocess.run(
        ["git", "apply", "-"], cwd=repo, env=env, input=_new_file(mode).encode(), capture_output=True
    )
    target = repo / "evil-link"
    if done.returncode != 0:
        return "refused"
    if target.is_symlink():
        return "link"
    return "file" if target.is_file() else "other"


def test_git_reads_link_modes_in_every_spelling(tmp_path: Path) -> None:
    """The premise: git turns these spellings into a symbolic link (the judge once matched '120000' only)."""
    for mode in ("120000", "0120000", "120777", "120644", "100000120000", "+120000"):
        assert _git_makes(tmp_path, mode) == "link", mode
    assert _git_makes(tmp_path, "100644") == "file"


@pytest.mark.parametrize("mode", NOT_REGULAR)
def test_every_header_with_a_non_regular_mode_is_refused(mode: str) -> None:
    for header, text in _headers(mode).items():
        with pytest.raises(IntegrityError, match="the stack was refused"):
            touched_paths(text.encode(), "0001-x.patch")
        assert header  # (named in the failure above through the parametrised mode)


@pytest.mark.parametrize("mode", REGULAR)
def test_regular_modes_pass_the_judge(mode: str) -> None:
    for text in _headers(mode).values():
        touched_paths(text.encode(), "0001-x.patch")


def test_git_mode_reads_octal_like_strtoul() -> None:
    assert git_mode("0120000") == git_mode("120000") == 0o120000
    assert git_mode(" \t100755\n") == 0o100755
    assert git_mode("100000120000") == 0o120000  # 32-bit wrap, as git stores it
    assert git_mode("-1") == 0xFFFFFFFF
    assert git_mode("abc") is None and git_mode("") is None and git_mode("8") is None


@pytest.mark.parametrize("mode", ["0120000", "120777", "120644"])
def test_symlink_patch_refuses_the_whole_stack_and_leaves_the_tree(
    ctx: Context, tmp_path: Path, upstream_pin, mode: str
) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    good = (
        "diff --git a/src/model.cpp b/src/model.cpp\n--- a/src/model.cpp\n+++ b/src/model.cpp\n"
        "@@ -1 +1 @@\n-int layers() { return 4; }\n+int layers() { return 8; }\n"
    )
    series = SERIES_HEADER
    for name, text in (("0001-good.patch", good), ("0002-evil-link.patch", _new_file(mode))):
        (patches / name).write_text(text)
        series += f"{name} {hashlib.sha256(text.encode()).hexdigest()}\n"
    (patches / "series").write_text(series)
    with pytest.raises(IntegrityError, match=r"0002-evil-link.patch creates or changes a symbolic link"):
        ensure_patched(ctx, pin=upstream_pin, patches_dir=patches)
    root = ctx.workspace.patched
    assert not root.exists() or [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
