"""`dgr patch --rebase-onto` on a small upstream with real git: every classification, the byte-identical
refresh onto the pin itself, a renumbered series that dgr's own stack applies onto the candidate, the
candidate from a git source or a directory, and the exit codes (0 all applied, 5 a conflict, 2/6)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from core.context import Context
from core.errors import ConfigurationError, RuntimeFailure
from fetch.source import Pin, SdistPin, SourcesPin
from patches import rebase
from patches.dev import make_dev_tree, refresh
from patches.stack import SERIES_HEADER, ensure_patched, read_series
from tests.conftest import git

LINES = [f"int line_{i:02d} = {i};" for i in range(1, 41)]  # 40 distinct lines; patches touch line 20


def _write(root: Path, name: str, lines: list[str]) -> None:
    (root / "src" / name).write_text("\n".join(lines) + "\n")


def _edited(index: int, text: str, lines: list[str] = LINES) -> list[str]:
    return lines[:index] + [text] + lines[index + 1 :]


@dataclass(frozen=True, kw_only=True)
class Stack:
    pin: Pin
    bare: Path
    patches: Path
    moved: str  # a: lines inserted above, b: a context line changed, c: a rewritten line changed
    taken: str  # a: lines inserted above, b: already carries 0002's change
    work: Path


def _pin(bare: Path, commit: str, tree: str) -> Pin:
    sdist = SdistPin(
        package="tiny", version="1.0", filename="tiny-1.0.tar.gz", sha256="0" * 64, subtree="vendor/tiny"
    )
    return Pin(
        schema_version=1,
        upstream=bare.as_uri(),
        commit=commit,
        tree=tree,
        sources=SourcesPin(order=("git",), sdist=sdist),
    )


def _commit(work: Path, message: str) -> str:
    git("add", "-A", "-f", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Stack:
    """The small upstream and its patch stack, made once for the module (the tests copy the patches)."""
    tmp_path = tmp_path_factory.mktemp("stack")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "GIT_"))}
    ctx = Context.from_env(dict(env, DGR_WORK=str(tmp_path / "work"), DGR_CACHE=str(tmp_path / "cache")))
    work = tmp_path / "upstream-work"
    (work / "src").mkdir(parents=True)
    for name in ("a.cpp", "b.cpp", "c.cpp", "d.cpp"):
        _write(work, name, LINES)
    git("init", "-q", "-b", "main", str(work))
    first = _commit(work, "first")
    tree = git("rev-parse", "HEAD^{tree}", cwd=work)
    # Two later upstream states, each on its own branch from the pin.
    git("checkout", "-q", "-b", "moved", cwd=work)
    _write(work, "a.cpp", [f"// new {i}" for i in range(5)] + LINES)
    _write(work, "b.cpp", _edited(16, "int line_17 = 1700;  // upstream changed a context line"))
    _write(work, "c.cpp", _edited(19, "int line_20 = 2000;  // upstream rewrote 0003's line"))
    moved = _commit(work, "upstream moved")
    git("checkout", "-q", "-b", "taken", first, cwd=work)
    _write(work, "a.cpp", [f"// new {i}" for i in range(5)] + LINES)
    _write(work, "b.cpp", _edited(19, "int line_20 = 22;  // patch 2"))
    taken = _commit(work, "upstream took 0002")
    bare = tmp_path / "upstream.git"
    git("clone", "-q", "--bare", "--mirror", str(work), str(bare))
    pin = _pin(bare, first, tree)

    # The patches, written the patch-writer's way: a dev tree, one commit each, refresh.
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "series").write_text(SERIES_HEADER)
    dev = tmp_path / "dev"
    make_dev_tree(ctx, dev, pin=pin, patches_dir=patches)
    for number, name in enumerate(("a.cpp", "b.cpp", "c.cpp", "d.cpp"), 1):
        _write(dev, name, _edited(19, f"int line_20 = {number}{number};  // patch {number}"))
        git("commit", "-q", "-am", f"change {name}\n\nPatch {number} rewrites line 20 of {name}.", cwd=dev)
    refresh(ctx, dev, pin=pin, patches_dir=patches)
    assert [e.name for e in read_series(patches)] == [
        "0001-change-a-cpp.patch",
        "0002-change-b-cpp.patch",
        "0003-change-c-cpp.patch",
        "0004-change-d-cpp.patch",
    ]
    return Stack(pin=pin, bare=bare, patches=patches, moved=moved, taken=taken, work=work)


@pytest.fixture
def stack(built: Stack, tmp_path: Path) -> Stack:
    patches = tmp_path / "patches"
    shutil.copytree(built.patches, patches)
    return replace(built, patches=patches)


def _statuses(result: rebase.Rebase) -> list[tuple[str, str]]:
    return [(o.name[:4], o.status) for o in result.outcomes]


def test_onto_the_pin_itself_every_patch_is_clean_and_the_series_is_byte_identical(
    ctx: Context, stack: Stack, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = rebase.rebase_onto(
        ctx, stack.pin.commit, from_git=str(stack.bare), out=out, pin=stack.pin, patches_dir=stack.patches
    )
    assert result.ok and result.series_written and result.kept_tree is None
    assert _statuses(result) == [(f"{n:04d}", "clean") for n in range(1, 5)]
    assert all(not o.offsets for o in result.outcomes)
    assert result.candidate_tree == stack.pin.tree
    names = sorted(p.name for p in (out / "patches").iterdir())
    assert names == sorted(p.name for p in stack.patches.iterdir())
    for name in names:
        assert (out / "patches" / name).read_bytes() == (stack.patches / name).read_bytes(), name
    assert not (out / "tree").exists()  # the repository goes once everything applied
    record = json.loads((out / "rebase.json").read_text())
    assert record["kind"] == "dgr.rebase" and record["candidate"]["commit"] == stack.pin.commit
    assert [p["status"] for p in record["patches"]] == ["clean"] * 4


def test_upstream_moved_clean_with_offset_3way_and_a_named_conflict(
    ctx: Context, stack: Stack, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    patches_before = {p.name: p.read_bytes() for p in stack.patches.iterdir()}
    result = rebase.rebase_onto(
        ctx, stack.moved, from_git=stack.bare.as_uri(), out=out, pin=stack.pin, patches_dir=stack.patches
    )
    print("\n" + rebase.table(result))
    assert _statuses(result) == [
        ("0001", "clean"),
        ("0002", "3-way"),
        ("0003", "conflict"),
        ("0004", "clean"),
    ]
    by = {o.name[:4]: o for o in result.outcomes}
    assert by["0001"].offsets == ("src/a.cpp: hunk #1 at line 22 (offset +5)",)
    assert by["0003"].conflicts == ("src/c.cpp",) and "conflict" in by["0003"].detail
    assert by["0002"].conflicts == () and by["0002"].files == ("src/b.cpp",)
    assert all(o.refreshed is None for o in result.outcomes)  # no series, no new names
    assert not result.ok and not result.series_written and not (out / "patches").exists()
    # The repository stays for the patch-writer: a dev tree rooted at the candidate, `judged` with the
    # three patches that applied, `rebased` stopped at 0003 with its conflict markers in place.
    kept = result.kept_tree
    assert kept == out / "tree"
    root = git("rev-list", "--max-parents=0", "rebased", cwd=kept)
    assert git("log", "-1", "--format=%s", root, cwd=kept) == f"pristine {stack.moved}"
    assert git("rev-parse", f"{root}^{{tree}}", cwd=kept) == result.candidate_tree
    judged = git("log", "--format=%s", f"{root}..judged", cwd=kept).splitlines()
    assert judged == ["0004-change-d-cpp.patch", "0002-change-b-cpp.patch", "0001-change-a-cpp.patch"]
    assert git("log", "--format=%s", f"{root}..HEAD", cwd=kept).splitlines() == judged[1:]
    assert git("ls-files", "-u", cwd=kept).count("src/c.cpp") == 3
    assert "<<<<<<<" in (kept / "src" / "c.cpp").read_text()
    assert (kept / ".git" / "MERGE_MSG").read_text().startswith("0003-change-c-cpp.patch\n\n")
    record = json.loads((out / "rebase.json").read_text())
    assert record["patches"][2]["conflicts"] == ["src/c.cpp"] and record["series_written"] is False
    assert {p.name: p.read_bytes() for p in stack.patches.iterdir()} == patches_before


def test_a_conflict_resolved_in_the_kept_tree_refreshes_once_the_pin_moves(
    ctx: Context, stack: Stack, tmp_path: Path
) -> None:
    """The documented way on: resolve, `git commit`, cherry-pick the rest, move the pin, refresh."""
    result = rebase.rebase_onto(
        ctx,
        stack.moved,
        from_git=str(stack.bare),
        out=tmp_path / "out",
        pin=stack.pin,
        patches_dir=stack.patches,
    )
    kept = result.kept_tree
    assert kept is not None
    _write(kept, "c.cpp", _edited(19, "int line_20 = 3300;  // patch 3 on upstream's 2000"))
    git("add", "src/c.cpp", cwd=kept)
    git("commit", "-q", "--no-edit", cwd=kept)  # the prepared message
    git("cherry-pick", "HEAD..judged", cwd=kept)
    new_pin = _pin(stack.bare, stack.moved, result.candidate_tree)
    new_patches = tmp_path / "new-patches"
    written = refresh(ctx, kept, pin=new_pin, patches_dir=new_patches)
    assert [name for name, _ in written] == [e.name for e in read_series(stack.patches)]
    c = (new_patches / "0003-change-c-cpp.patch").read_text()
    assert c.startswith("# 0003-change-c-cpp.patch\n# Patch 3 rewrites line 20 of c.cpp.\n")
    assert "-int line_20 = 2000;  // upstream rewrote 0003's line\n+int line_20 = 3300;" in c
    patched = ensure_patched(ctx, pin=new_pin, patches_dir=new_patches)
    assert "int line_20 = 3300;" in (patched.path / "src" / "c.cpp").read_text()


def test_a_patch_upstream_took_is_dropped_and_the_refreshed_series_applies(
    ctx: Context, stack: Stack, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = rebase.rebase_onto(
        ctx, stack.taken, from_git=str(stack.bare), out=out, pin=stack.pin, patches_dir=stack.patches
    )
    assert _statuses(result) == [
        ("0001", "clean"),
        ("0002", "upstream"),
        ("0003", "clean"),
        ("0004", "clean"),
    ]
    assert [o.refreshed for o in result.outcomes] == [
        "0001-change-a-cpp.patch",
        None,
        "0002-change-c-cpp.patch",
        "0003-change-d-cpp.patch",
    ]
    entries = read_series(out / "patches")
    assert [e.name for e in entries] == [
        "0001-change-a-cpp.patch",
        "0002-change-c-cpp.patch",
        "0003-change-d-cpp.patch",
    ]
    renumbered = (out / "patches" / "0002-change-c-cpp.patch").read_text()
    assert renumbered.startswith("# 0002-change-c-cpp.patch\n# Patch 3 rewrites line 20 of c.cpp.\n\ndiff")
    assert "\n@@ -22,7 +22,7 @@" in (out / "patches" / "0001-change-a-cpp.patch").read_text()  # was -17
    # dgr's own stack applies the refreshed series onto the candidate (its pin fetched by git).
    tree = git("rev-parse", f"{stack.taken}^{{tree}}", cwd=stack.work)
    patched = ensure_patched(ctx, pin=_pin(stack.bare, stack.taken, tree), patches_dir=out / "patches")
    for number, name in enumerate(("a.cpp", "c.cpp", "d.cpp")):
        want = {0: "11", 1: "33", 2: "44"}[number]
        assert f"int line_20 = {want};" in (patched.path / "src" / name).read_text()
    assert "int line_20 = 22;" in (patched.path / "src" / "b.cpp").read_text()


def test_the_candidate_from_a_directory_gives_the_same_answer(
    ctx: Context, stack: Stack, tmp_path: Path
) -> None:
    files = tmp_path / "candidate"
    files.mkdir()
    git("--work-tree", str(files), "checkout", stack.moved, "--", ".", cwd=stack.work)
    result = rebase.rebase_onto(
        ctx, stack.moved, tree=files, out=tmp_path / "out", pin=stack.pin, patches_dir=stack.patches
    )
    assert _statuses(result) == [
        ("0001", "clean"),
        ("0002", "3-way"),
        ("0003", "conflict"),
        ("0004", "clean"),
    ]
    assert result.candidate_tree == git("rev-parse", f"{stack.moved}^{{tree}}", cwd=stack.work)
    assert result.source == str(files)


def _sdist(stack: Stack, tmp_path: Path, commit: str, version: str) -> Path:
    """A llama-cpp-python-shaped sdist whose vendored tree is ``commit``'s files (and a .git pointer)."""
    files = tmp_path / f"files-{version}"
    files.mkdir()
    git("--work-tree", str(files), "checkout", commit, "--", ".", cwd=stack.work)
    (files / ".git").write_text("gitdir: ../../.git/modules/vendor/tiny\n")
    out = tmp_path / f"tiny-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(files, arcname=f"tiny-{version}/vendor/tiny")
    return out


def test_the_candidate_from_an_sdist_file_or_version(ctx: Context, stack: Stack, tmp_path: Path) -> None:
    sdist = _sdist(stack, tmp_path, stack.moved, "1.1")
    result = rebase.rebase_onto(
        ctx, stack.moved, sdist=str(sdist), out=tmp_path / "o1", pin=stack.pin, patches_dir=stack.patches
    )
    assert _statuses(result) == [
        ("0001", "clean"),
        ("0002", "3-way"),
        ("0003", "conflict"),
        ("0004", "clean"),
    ]
    assert result.candidate_tree == git("rev-parse", f"{stack.moved}^{{tree}}", cwd=stack.work)
    assert result.source == f"sdist tiny-1.1.tar.gz sha256 {hashlib.sha256(sdist.read_bytes()).hexdigest()}"
    assert sorted(p.name for p in (tmp_path / "o1").iterdir()) == ["rebase.json", "tree"]
    asked: list[str] = []

    def download(ctx_: Context, pin: Pin, into: Path) -> None:  # pip's stand-in: the package index
        asked.append(f"{pin.sources.sdist.package}=={pin.sources.sdist.version}")
        shutil.copy(_sdist(stack, tmp_path, stack.taken, pin.sources.sdist.version), into)

    result = rebase.rebase_onto(
        ctx,
        stack.taken,
        sdist="1.2",
        out=tmp_path / "o2",
        pin=stack.pin,
        patches_dir=stack.patches,
        download=download,
    )
    assert asked == ["tiny==1.2"] and result.ok and result.source.startswith("sdist tiny-1.2.tar.gz sha256 ")
    assert sorted(p.name for p in (tmp_path / "o2").iterdir()) == ["patches", "rebase.json"]
    with pytest.raises(ConfigurationError, match="neither a file nor a version"):
        rebase.rebase_onto(
            ctx, stack.taken, sdist="../x", out=tmp_path / "o3", pin=stack.pin, patches_dir=stack.patches
        )


def test_write_patches_replaces_the_series_only_when_asked_and_only_without_conflict(
    ctx: Context, stack: Stack, tmp_path: Path
) -> None:
    before = {p.name: p.read_bytes() for p in stack.patches.iterdir()}
    rebase.rebase_onto(
        ctx,
        stack.moved,
        from_git=str(stack.bare),
        out=tmp_path / "o1",
        pin=stack.pin,
        patches_dir=stack.patches,
        write_patches=True,
    )
    assert {p.name: p.read_bytes() for p in stack.patches.iterdir()} == before
    rebase.rebase_onto(
        ctx,
        stack.taken,
        from_git=str(stack.bare),
        out=tmp_path / "o2",
        pin=stack.pin,
        patches_dir=stack.patches,
    )
    assert {p.name: p.read_bytes() for p in stack.patches.iterdir()} == before
    rebase.rebase_onto(
        ctx,
        stack.taken,
        from_git=str(stack.bare),
        out=tmp_path / "o3",
        pin=stack.pin,
        patches_dir=stack.patches,
        write_patches=True,
    )
    assert sorted(p.name for p in stack.patches.iterdir()) == sorted(
        p.name for p in (tmp_path / "o3" / "patches").iterdir()
    )
    assert (stack.patches / "series").read_bytes() == (tmp_path / "o3" / "patches" / "series").read_bytes()


def test_the_default_git_source_is_dgr_llama_git_url(ctx: Context, stack: Stack, tmp_path: Path) -> None:
    mirror = Context.from_env(dict(ctx.env, DGR_LLAMA_GIT_URL=stack.bare.as_uri()))
    result = rebase.rebase_onto(
        mirror, stack.taken, out=tmp_path / "out", pin=stack.pin, patches_dir=stack.patches
    )
    assert result.ok and result.source == stack.bare.as_uri()


def test_refusals(ctx: Context, stack: Stack, tmp_path: Path) -> None:
    call = functools.partial(
        rebase.rebase_onto, ctx, pin=stack.pin, patches_dir=stack.patches, out=tmp_path / "out"
    )
    with pytest.raises(ConfigurationError, match="40-hex"):
        call("moved", from_git=str(stack.bare))
    with_git = tmp_path / "with-git"
    shutil.copytree(stack.work, with_git)
    with pytest.raises(ConfigurationError, match="contains a .git"):
        call(stack.moved, tree=with_git)
    with pytest.raises(RuntimeFailure, match="could not fetch") as caught:
        call("f" * 40, from_git=str(stack.bare))
    assert caught.value.exit_code == 6 and "--tree DIR" in (caught.value.hint or "")
    assert not (tmp_path / "out").exists()


def test_cli_exit_codes(ctx: Context, stack: Stack, tmp_path: Path, monkeypatch, capsys) -> None:
    from cli.main import main

    monkeypatch.setenv("DGR_WORK", str(ctx.workspace.root))
    monkeypatch.setenv("DGR_CACHE", str(ctx.workspace.cache))
    monkeypatch.setattr(
        rebase, "rebase_onto", functools.partial(rebase.rebase_onto, pin=stack.pin, patches_dir=stack.patches)
    )
    assert main(["patch", "--rebase-onto", stack.taken, "--from-git", str(stack.bare)]) == 0
    said = capsys.readouterr().out
    assert "0002-change-b-cpp.patch  upstream" in said and "-> 0002-change-c-cpp.patch" in said
    assert "(3 patch(es))" in said
    assert (ctx.workspace.root / "rebase" / stack.taken[:12] / "patches" / "series").is_file()
    assert main(["patch", "--rebase-onto", stack.moved, "--from-git", str(stack.bare)]) == 5
    captured = capsys.readouterr()
    assert "0003-change-c-cpp.patch  conflict  src/c.cpp" in captured.out
    assert "gate failed: 1 of 4 patch(es) conflict" in captured.err
    assert "0003-change-c-cpp.patch" in captured.err
    assert main(["patch", "--tree", str(tmp_path)]) == 2
    assert "only go with --rebase-onto" in capsys.readouterr().err
