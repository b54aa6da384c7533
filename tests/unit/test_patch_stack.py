"""The patch stack on a small fixture tree: apply, idempotence, refusals (tree unchanged), refresh loop."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from core.context import Context
from core.errors import ConfigurationError, IntegrityError
from fetch import gittree
from fetch.source import ensure_pristine
from patches.dev import make_dev_tree, refresh
from patches.stack import SERIES_HEADER, ensure_patched, read_series
from tests.conftest import git


@pytest.fixture
def patches_dir(tmp_path: Path) -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    (d / "series").write_text(SERIES_HEADER)
    return d


def _add(patches_dir: Path, name: str, text: str) -> None:
    data = text.encode()
    (patches_dir / name).write_bytes(data)
    with open(patches_dir / "series", "a") as fh:
        fh.write(f"{name} {hashlib.sha256(data).hexdigest()}\n")


def _patched_entries(ctx: Context) -> list[str]:
    root = ctx.workspace.patched
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) if root.exists() else []


GOOD = """\
# 0001-more-layers.patch
diff --git a/src/model.cpp b/src/model.cpp
--- a/src/model.cpp
+++ b/src/model.cpp
@@ -1 +1 @@
-int layers() { return 4; }
+int layers() { return 8; }
"""


def test_empty_series_gives_a_copy_equal_to_pristine(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    patched = ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    assert patched.digest == pristine.tree == upstream_pin.tree
    assert patched.path.parent == ctx.workspace.patched and patched.path.name == patched.key
    assert patched.path != pristine.path and (patched.path / "src" / "model.cpp").is_file()
    assert patched.provenance["patches"] == [] and patched.provenance["pristine"]["tree"] == pristine.tree


def test_apply_records_digests_and_second_run_is_a_no_op(
    ctx: Context, upstream_pin, patches_dir: Path
) -> None:
    _add(patches_dir, "0001-more-layers.patch", GOOD)
    first = ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    assert (first.path / "src" / "model.cpp").read_text() == "int layers() { return 8; }\n"
    assert first.digest != upstream_pin.tree
    assert first.digest == gittree.tree_id(first.path, ctx.env)
    assert first.provenance["patches"] == [
        {"number": 1, "name": "0001-more-layers.patch", "sha256": hashlib.sha256(GOOD.encode()).hexdigest()}
    ]
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    assert (pristine.path / "src" / "model.cpp").read_text() == "int layers() { return 4; }\n"
    inode = first.path.stat().st_ino
    second = ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    assert second.provenance == first.provenance and second.path.stat().st_ino == inode
    assert _patched_entries(ctx) == sorted([first.key, f"{first.key}.provenance.json"])


def test_hand_edited_patched_tree_is_rebuilt(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    _add(patches_dir, "0001-more-layers.patch", GOOD)
    first = ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    (first.path / "src" / "model.cpp").write_text("hacked\n")
    again = ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    assert (again.path / "src" / "model.cpp").read_text() == "int layers() { return 8; }\n"
    assert again.digest == first.digest
    assert _patched_entries(ctx) == sorted([first.key, f"{first.key}.provenance.json"])


def _assert_refused(ctx: Context, upstream_pin, patches_dir: Path, match: str) -> None:
    pristine = ensure_pristine(ctx, pin=upstream_pin)
    stamp = gittree.tree_stamp(pristine.path)
    with pytest.raises(IntegrityError, match=match) as err:
        ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    assert err.value.exit_code == 3
    assert _patched_entries(ctx) == []
    assert gittree.tree_stamp(pristine.path) == stamp
    assert gittree.tree_id(pristine.path, ctx.env) == upstream_pin.tree


def test_digest_mismatch_refuses_the_stack(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    _add(patches_dir, "0001-more-layers.patch", GOOD)
    (patches_dir / "0001-more-layers.patch").write_text(GOOD.replace("8", "9"))
    _assert_refused(ctx, upstream_pin, patches_dir, "0001-more-layers.patch: sha256 .* series says")


def test_numbering_gap_refuses_the_stack(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    _add(patches_dir, "0001-more-layers.patch", GOOD)
    _add(patches_dir, "0003-later.patch", GOOD.replace("return 8;", "return 16;"))
    _assert_refused(ctx, upstream_pin, patches_dir, "expected 0002")


def test_missing_patch_file_refuses_the_stack(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    _add(patches_dir, "0001-more-layers.patch", GOOD)
    (patches_dir / "0001-more-layers.patch").unlink()
    _assert_refused(ctx, upstream_pin, patches_dir, "missing")


def _new_file(path: str, *, mode: str = "100644", header_path: str | None = None) -> str:
    hp = header_path or path
    return (
        f"diff --git a/{hp} b/{hp}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
        "@@ -0,0 +1 @@\n+pwned\n"
    )


HOSTILE = {
    "dotdot": (_new_file("../escape.txt"), "'..'"),
    "dotdot-deep": (_new_file("src/../../escape.txt"), "'..'"),
    "absolute-in-plusplus": (
        _new_file("/tmp/dgr-patch-escape.txt", header_path="x.txt").replace("+++ b//tmp", "+++ /tmp"),
        "is absolute",
    ),
    "symlink-created": (_new_file("src/link", mode="120000"), "symbolic link"),
    "gitlink-created": (_new_file("src/sub", mode="160000"), "submodule"),
    "through-symlink": (GOOD.replace("src/model.cpp", "docs/model.cpp"), "symbolic link docs"),
    "into-dot-git": (_new_file(".git/hooks/post-checkout"), ".git"),
    "rename-out": (
        "diff --git a/README.md b/../README.md\nsimilarity index 100%\n"
        "rename from README.md\nrename to ../README.md\n",
        "'..'",
    ),
    "smuggled-old-style": (
        GOOD + "--- a/../escape.txt\n+++ b/../escape.txt\n@@ -0,0 +1 @@\n+x\n",
        "non-git diff header",
    ),
    "preamble-old-style": ("--- /dev/null\n+++ b/escape.txt\n@@ -0,0 +1 @@\n+x\n", "non-git diff header"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_unsafe_patch_refuses_the_whole_stack(
    ctx: Context, tmp_path: Path, upstream_pin, patches_dir: Path, case: str
) -> None:
    text, match = HOSTILE[case]
    _add(patches_dir, "0001-more-layers.patch", GOOD)  # a good patch first: it must not be applied either
    _add(patches_dir, "0002-hostile.patch", text)
    _assert_refused(ctx, upstream_pin, patches_dir, match)
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/dgr-patch-escape.txt").exists()


def test_patch_that_does_not_apply_leaves_nothing(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    _add(patches_dir, "0001-more-layers.patch", GOOD)
    _add(patches_dir, "0002-again.patch", GOOD)  # its context is gone after 0001
    _assert_refused(ctx, upstream_pin, patches_dir, "0002-again.patch does not apply")


@pytest.mark.parametrize(
    "line, error",
    [
        ("0001-x.patch", ConfigurationError),
        ("0001-x.patch deadbeef", ConfigurationError),
        (f"../0001-x.patch {'a' * 64}", IntegrityError),
        (f"0001-X.PATCH {'a' * 64}", IntegrityError),
        (f"1-x.patch {'a' * 64}", IntegrityError),
    ],
)
def test_malformed_series_lines(patches_dir: Path, line: str, error: type) -> None:
    with open(patches_dir / "series", "a") as fh:
        fh.write(line + "  # trailing comment\n")
    with pytest.raises(error):
        read_series(patches_dir)


@pytest.mark.parametrize("bad", [b"\xff", b"\xed\xb2\x80"], ids=["invalid byte", "encoded surrogate"])
def test_a_series_that_is_not_utf8_is_refused_with_one_line(patches_dir: Path, bad: bytes) -> None:
    """Once a UnicodeDecodeError traceback; now the one encoding policy's refusal (exit 2)."""
    with open(patches_dir / "series", "ab") as fh:
        fh.write(b"# a comment " + bad + b"\n")
    with pytest.raises(ConfigurationError, match="is not UTF-8 text") as caught:
        read_series(patches_dir)
    assert caught.value.exit_code == 2 and str(patches_dir / "series") in caught.value.message


def test_refresh_round_trip(ctx: Context, tmp_path: Path, upstream_pin, patches_dir: Path) -> None:
    dev = tmp_path / "dev"
    make_dev_tree(ctx, dev, pin=upstream_pin, patches_dir=patches_dir)
    assert git("log", "--format=%s", cwd=dev) == f"pristine {upstream_pin.commit}"
    (dev / "src" / "model.cpp").write_text("int layers(int stage) { return stage ? 2 : 4; }\n")
    (dev / "src" / "stage.h").write_text("struct stage { int begin, end; };\n")
    git("add", "-A", cwd=dev)
    git("commit", "-q", "-m", "Range-aware loading!", "-m", "Loads only owned layers.", cwd=dev)
    (dev / "src" / "cache.gen").write_text("ignored name, committed on purpose\n")
    (dev / "README.md").unlink()
    git("add", "-A", "-f", cwd=dev)
    git("commit", "-q", "-m", "Layer-filtered KV", cwd=dev)

    written = refresh(ctx, dev, pin=upstream_pin, patches_dir=patches_dir)
    assert [n for n, _ in written] == ["0001-range-aware-loading.patch", "0002-layer-filtered-kv.patch"]
    first_bytes = {n: (patches_dir / n).read_bytes() for n, _ in written}
    assert b"# Loads only owned layers." in first_bytes["0001-range-aware-loading.patch"]
    entries = read_series(patches_dir)
    assert [(e.name, e.sha256) for e in entries] == written

    patched = ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir)
    assert patched.digest == git("rev-parse", "HEAD^{tree}", cwd=dev)

    # Same commits, same bytes.
    assert refresh(ctx, dev, pin=upstream_pin, patches_dir=patches_dir) == written
    assert {n: (patches_dir / n).read_bytes() for n, _ in written} == first_bytes

    # A dev tree made from the series has one commit per patch, named after it, and refreshes identically.
    dev2 = tmp_path / "dev2"
    make_dev_tree(ctx, dev2, pin=upstream_pin, patches_dir=patches_dir)
    assert git("log", "--reverse", "--format=%s", cwd=dev2).splitlines()[1:] == [n for n, _ in written]
    assert git("rev-parse", "HEAD^{tree}", cwd=dev2) == patched.digest
    assert refresh(ctx, dev2, pin=upstream_pin, patches_dir=patches_dir) == written

    # Squashing to one commit renumbers and removes the stale file.
    git("reset", "-q", "--soft", "HEAD~1", cwd=dev2)
    git("commit", "-q", "--amend", "-m", "0001-range-aware-loading.patch", cwd=dev2)
    again = refresh(ctx, dev2, pin=upstream_pin, patches_dir=patches_dir)
    assert [n for n, _ in again] == ["0001-range-aware-loading.patch"]
    assert sorted(p.name for p in patches_dir.iterdir()) == ["0001-range-aware-loading.patch", "series"]
    assert ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir).digest == patched.digest


def test_refresh_refuses_uncommitted_work_and_foreign_trees(
    ctx: Context, tmp_path: Path, upstream_pin, patches_dir: Path
) -> None:
    dev = tmp_path / "dev"
    make_dev_tree(ctx, dev, pin=upstream_pin, patches_dir=patches_dir)
    (dev / "README.md").write_text("edited, not committed\n")
    with pytest.raises(ConfigurationError, match="uncommitted"):
        refresh(ctx, dev, pin=upstream_pin, patches_dir=patches_dir)
    with pytest.raises(ConfigurationError, match="not a `dgr patch --dev` tree"):
        refresh(ctx, tmp_path / "patches", pin=upstream_pin, patches_dir=patches_dir)
    with pytest.raises(ConfigurationError, match="not empty"):
        make_dev_tree(ctx, dev, pin=upstream_pin, patches_dir=patches_dir)


def test_concurrent_runs_agree(ctx: Context, upstream_pin, patches_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _add(patches_dir, "0001-more-layers.patch", GOOD)
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda _: ensure_patched(ctx, pin=upstream_pin, patches_dir=patches_dir), range(2))
        )
    assert results[0].digest == results[1].digest and results[0].path == results[1].path
    assert _patched_entries(ctx) == sorted([results[0].key, f"{results[0].key}.provenance.json"])
