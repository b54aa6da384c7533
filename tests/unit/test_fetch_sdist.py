"""The sdist mirror against a fixture .tar.gz built here: cache, digest checks, extraction, fallback."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from core.canonical import sha256_file
from core.context import Context
from core.errors import IntegrityError, RuntimeFailure
from fetch import gittree
from fetch.source import Pin, SdistPin, archive_path, ensure_pristine, fetch_sdist, obtain_archive, tree_dir
from tests.unit.full_disk import run_on_full_disk


def _build_sdist(tmp_path: Path, upstream_work: Path, *, extra: tarfile.TarInfo | None = None) -> Path:
    """tiny-1.0.tar.gz vendoring the fixture's first commit under vendor/tiny, with a .git pointer."""
    out = tmp_path / "dist" / "tiny-1.0.tar.gz"
    out.parent.mkdir(exist_ok=True)
    src = tmp_path / "export"
    if not src.exists():
        from tests.conftest import git

        git("worktree", "add", "-q", "--detach", str(src), "HEAD~1", cwd=upstream_work)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src / "README.md", "tiny-1.0/README.md")
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src).as_posix()
            if rel == ".git" or path.is_dir() and not path.is_symlink():
                continue
            if path.is_symlink():
                continue  # like the real sdist: no links (the pin below names the tree without it)
            tar.add(path, f"tiny-1.0/vendor/tiny/{rel}")
        pointer = b"gitdir: ../../.git/modules/vendor/tiny\n"
        info = tarfile.TarInfo("tiny-1.0/vendor/tiny/.git")
        info.size = len(pointer)
        tar.addfile(info, io.BytesIO(pointer))
        if extra is not None:
            tar.addfile(extra, io.BytesIO(b"x" * extra.size))
    return out


@pytest.fixture
def sdist(tmp_path: Path, upstream, upstream_pin, ctx: Context):
    """(archive path, pin naming it, the expected tree id) — the tree id computed from a clean export."""
    archive = _build_sdist(tmp_path, upstream.work)
    check = tmp_path / "expected"
    check.mkdir()
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith("tiny-1.0/vendor/tiny/") and m.name != "tiny-1.0/vendor/tiny/.git"
        ]
        for m in members:
            m.name = m.name.removeprefix("tiny-1.0/vendor/tiny/")
        tar.extractall(check, members=members, filter="data")
    tree = gittree.tree_id(check, ctx.env)
    sd = SdistPin(
        package="tiny",
        version="1.0",
        filename="tiny-1.0.tar.gz",
        sha256=sha256_file(archive),
        subtree="vendor/tiny",
        max_members=100,
        max_bytes=1 << 20,
    )
    pin = dataclasses.replace(
        upstream_pin, tree=tree, sources=dataclasses.replace(upstream_pin.sources, order=("sdist",), sdist=sd)
    )
    return archive, pin


class Index:
    """Stands in for the package index: a real copy from a local folder, counting calls."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        self.calls = 0

    def __call__(self, ctx: Context, pin, into: Path) -> None:
        self.calls += 1
        shutil.copy(self.archive, into / pin.sources.sdist.filename)


def test_download_verify_extract(ctx: Context, sdist) -> None:
    archive, pin = sdist
    index = Index(archive)
    dest = ctx.workspace.root / "dest"
    dest.mkdir(parents=True)
    details = fetch_sdist(ctx, pin, dest, download=index)
    assert index.calls == 1
    assert details["archive"]["sha256"] == pin.sources.sdist.sha256 and details["archive"]["downloaded"]
    assert not (dest / ".git").exists()
    assert gittree.tree_id(dest, ctx.env) == pin.tree
    assert sha256_file(archive_path(ctx, pin)) == pin.sources.sdist.sha256
    # The cache lives outside the workspace; a second use re-hashes it and does not download.
    assert not str(archive_path(ctx, pin)).startswith(str(ctx.workspace.root))
    path, downloaded = obtain_archive(ctx, pin, download=index)
    assert (path, downloaded, index.calls) == (archive_path(ctx, pin), False, 1)


def test_download_with_wrong_digest_is_discarded(ctx: Context, sdist) -> None:
    archive, pin = sdist
    bad = dataclasses.replace(
        pin,
        sources=dataclasses.replace(
            pin.sources, sdist=dataclasses.replace(pin.sources.sdist, sha256="3" * 64)
        ),
    )
    with pytest.raises(IntegrityError) as err:
        obtain_archive(ctx, bad, download=Index(archive))
    msg = err.value.message
    assert "sdist tiny==1.0" in msg and "3" * 64 in msg and sha256_file(archive) in msg
    assert list(archive_path(ctx, bad).parent.iterdir()) == []


def test_corrupt_cached_archive_is_deleted_and_fetched_again(ctx: Context, sdist) -> None:
    archive, pin = sdist
    cached = archive_path(ctx, pin)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(archive.read_bytes()[:-10] + b"tampered!!")
    index = Index(archive)
    path, downloaded = obtain_archive(ctx, pin, download=index)
    assert downloaded and index.calls == 1
    assert sha256_file(path) == pin.sources.sdist.sha256


def test_ensure_pristine_from_sdist_records_provenance(ctx: Context, sdist) -> None:
    archive, pin = sdist
    cached = archive_path(ctx, pin)
    cached.parent.mkdir(parents=True)
    shutil.copy(archive, cached)  # what a previous workspace left in the shared cache
    pristine = ensure_pristine(ctx, pin=pin)
    prov = pristine.provenance
    assert prov["source"] == "sdist" and prov["tree"] == pin.tree
    assert prov["archive"]["sha256"] == pin.sources.sdist.sha256
    assert prov["archive"]["package"] == "tiny" and prov["archive"]["version"] == "1.0"
    assert prov["archive"]["downloaded"] is False


def test_git_unavailable_falls_back_to_a_verified_sdist(ctx: Context, tmp_path: Path, sdist) -> None:
    archive, pin = sdist
    pin = dataclasses.replace(
        pin,
        upstream=(tmp_path / "no-such.git").as_uri(),
        sources=dataclasses.replace(pin.sources, order=("git", "sdist")),
    )
    shutil.copy(archive, ctx.workspace.ensure(archive_path(ctx, pin).parent) / archive.name)
    pristine = ensure_pristine(ctx, pin=pin)
    assert pristine.provenance["source"] == "sdist"
    assert [a["outcome"] for a in pristine.provenance["attempts"]] == ["unavailable", "ok"]


def test_sdist_with_a_different_tree_is_refused(ctx: Context, tmp_path: Path, upstream, sdist) -> None:
    archive, pin = sdist
    shutil.copy(archive, ctx.workspace.ensure(archive_path(ctx, pin).parent) / archive.name)
    wrong = dataclasses.replace(pin, tree="4" * 40)
    with pytest.raises(IntegrityError, match="sdist source gave tree"):
        ensure_pristine(ctx, pin=wrong)
    assert not tree_dir(ctx, wrong).exists()


def _sdist_only(upstream_pin, archive: Path, *, max_bytes: int = 1 << 30) -> Pin:
    """``upstream_pin`` with the sdist (``archive``, by its digest) as its only source."""
    sd = SdistPin(
        package="tiny",
        version="1.0",
        filename="tiny-1.0.tar.gz",
        sha256=sha256_file(archive),
        subtree="vendor/tiny",
        max_bytes=max_bytes,
    )
    return dataclasses.replace(
        upstream_pin, sources=dataclasses.replace(upstream_pin.sources, order=("sdist",), sdist=sd)
    )


def test_hostile_sdist_is_refused_before_extraction(
    ctx: Context, tmp_path: Path, upstream, upstream_pin
) -> None:
    evil = tarfile.TarInfo("tiny-1.0/vendor/tiny/../../../../evil.txt")
    evil.size = 4
    archive = _build_sdist(tmp_path, upstream.work, extra=evil)
    pin = _sdist_only(upstream_pin, archive)
    shutil.copy(archive, ctx.workspace.ensure(archive_path(ctx, pin).parent) / archive.name)
    with pytest.raises(IntegrityError, match="'..' component"):
        ensure_pristine(ctx, pin=pin)
    assert [p.name for p in ctx.workspace.sources.iterdir() if not p.name.endswith(".lock")] == []
    assert not (tmp_path / "evil.txt").exists()


def test_download_failure_is_unavailable_not_integrity(ctx: Context, sdist) -> None:
    from core import proc

    _, pin = sdist

    def offline(ctx: Context, pin, into: Path) -> None:
        proc.run(["git", "ls-remote", str(into / "no-such-repo")])  # a real command that fails

    with pytest.raises(RuntimeFailure, match="download failed"):
        obtain_archive(ctx, pin, download=offline)


# `dgr fetch` in a child whose pin and package index are the fixture's: the real command line, so the
# test sees what a user sees (stderr, exit code), with DGR_WORK on a small tmpfs.
FETCH_CHILD = """
import json, shutil, sys
from pathlib import Path
from cli.main import main
from fetch import source
from manifests.loader import build
pin = build(source.Pin, json.loads(sys.argv[2]))
archive = Path(sys.argv[3])
source.load_pin = lambda path=None: pin
def index(ctx, pin, into):
    shutil.copy(archive, into / pin.sources.sdist.filename)
source.FETCHERS["sdist"] = lambda ctx, pin, dest: source.fetch_sdist(ctx, pin, dest, download=index)
code = main(["fetch", "--source", "sdist"])
left = sorted(p.name for p in Path(sys.argv[1], "src").iterdir() if not p.name.endswith(".lock"))
print(json.dumps({"code": code, "left": left}))
"""


def test_disk_full_while_extracting_is_one_line_and_leaves_nothing(
    ctx: Context, tmp_path: Path, upstream, upstream_pin
) -> None:
    """A real ENOSPC (DGR_WORK on a 256 KiB tmpfs in a private mount namespace, as provisioning's
    RELIABILITY 11 test does) while the sdist's 1 MiB file is extracted: one line, provisioning's
    exit code for a full disk (6), and no tree or temp dir left in the workspace."""
    big = tarfile.TarInfo("tiny-1.0/vendor/tiny/weights.bin")
    big.size = 1 << 20
    archive = _build_sdist(tmp_path, upstream.work, extra=big)
    pin = _sdist_only(upstream_pin, archive, max_bytes=4 << 20)
    done = run_on_full_disk(
        ctx.workspace.root,
        FETCH_CHILD,
        [str(ctx.workspace.root), json.dumps(dataclasses.asdict(pin)), str(archive)],
        ctx.env,
    )
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["code"] == 6, out
    assert lines[0].startswith("dgr: runtime failure: disk full during `dgr fetch`"), lines
    assert out["left"] == []  # the temp tree went with the failure; no final tree, no record
