"""Safe subtree extraction: every hostile member refuses the whole archive before anything is written."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from core.errors import IntegrityError
from fetch.archive import Caps, extract_subtree

PREFIX = "pkg-1.0/vendor/lib"
CAPS = Caps(max_members=100, max_bytes=1 << 20)


def _file(name: str, data: bytes = b"x\n", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def _special(name: str, kind: bytes, linkname: str = "", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    return info, b""


def _good_members() -> list[tuple[tarfile.TarInfo, bytes]]:
    return [
        _file("pkg-1.0/setup.py", b"print()\n"),
        _file(f"{PREFIX}/.git", b"gitdir: ../../.git/modules/lib\n"),
        _file(f"{PREFIX}/CMakeLists.txt", b"project(lib)\n"),
        _file(f"{PREFIX}/src/a.c", b"int a;\n"),
        _file(f"{PREFIX}/tools/run.sh", b"#!/bin/sh\n", mode=0o755),
    ]


def _archive(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    path = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _dest(tmp_path: Path) -> Path:
    dest = tmp_path / "dest"
    dest.mkdir()
    return dest


def test_extracts_only_the_subtree_and_drops_the_git_pointer(tmp_path: Path) -> None:
    dest = _dest(tmp_path)
    plan = extract_subtree(_archive(tmp_path, _good_members()), PREFIX, dest, CAPS, where="t", drop=(".git",))
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == ["CMakeLists.txt", "src/a.c", "tools/run.sh"]
    assert plan.files == 4  # judged and counted, then the pointer was left out
    assert (dest / "tools" / "run.sh").stat().st_mode & stat.S_IXUSR
    assert not (dest / "src" / "a.c").stat().st_mode & stat.S_IXUSR


HOSTILE = {
    "dotdot": _file(f"{PREFIX}/../../../escape.txt"),
    "dotdot-outside-subtree": _file("pkg-1.0/../escape.txt"),
    "absolute": _file("/tmp/dgr-absolute-escape.txt"),
    "symlink-outside": _special(f"{PREFIX}/evil", tarfile.SYMTYPE, "../../../../etc/passwd"),
    "symlink-absolute": _special(f"{PREFIX}/evil", tarfile.SYMTYPE, "/etc/passwd"),
    "symlink-inside": _special(f"{PREFIX}/alias", tarfile.SYMTYPE, "src/a.c"),
    "hardlink": _special(f"{PREFIX}/hard", tarfile.LNKTYPE, "etc/passwd"),
    "char-device": _special(f"{PREFIX}/null", tarfile.CHRTYPE),
    "block-device": _special(f"{PREFIX}/sda", tarfile.BLKTYPE),
    "fifo": _special(f"{PREFIX}/pipe", tarfile.FIFOTYPE),
    "setuid": _file(f"{PREFIX}/suid", b"#!/bin/sh\n", mode=0o4755),
    "setgid": _file(f"{PREFIX}/sgid", b"#!/bin/sh\n", mode=0o2755),
    "control-char": _file(f"{PREFIX}/bad\nname"),
    "duplicate": _file(f"{PREFIX}/src/a.c", b"int b;\n"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_member_refuses_everything_before_extraction(tmp_path: Path, case: str) -> None:
    # The hostile member comes last, so an extractor that wrote as it went would have written files.
    archive = _archive(tmp_path, _good_members() + [HOSTILE[case]])
    dest = _dest(tmp_path)
    with pytest.raises(IntegrityError) as err:
        extract_subtree(archive, PREFIX, dest, CAPS, where="sdist fixture", drop=(".git",))
    assert "sdist fixture" in err.value.message
    assert err.value.exit_code == 3
    assert list(dest.iterdir()) == []
    assert not Path("/tmp/dgr-absolute-escape.txt").exists()
    assert not (tmp_path / "escape.txt").exists()


def test_link_message_says_where_it_points(tmp_path: Path) -> None:
    archive = _archive(tmp_path, _good_members() + [HOSTILE["symlink-outside"]])
    with pytest.raises(IntegrityError, match="points outside the subtree"):
        extract_subtree(archive, PREFIX, _dest(tmp_path), CAPS, where="t")


def test_member_count_cap(tmp_path: Path) -> None:
    members = _good_members() + [_file(f"{PREFIX}/many/{i}") for i in range(20)]
    dest = _dest(tmp_path)
    with pytest.raises(IntegrityError, match="more than 10 members"):
        extract_subtree(
            _archive(tmp_path, members), PREFIX, dest, Caps(max_members=10, max_bytes=1 << 20), where="t"
        )
    assert list(dest.iterdir()) == []


def test_total_size_cap(tmp_path: Path) -> None:
    members = _good_members() + [_file(f"{PREFIX}/big.bin", b"\0" * 4096)]
    dest = _dest(tmp_path)
    with pytest.raises(IntegrityError, match="more than 1000 bytes"):
        extract_subtree(
            _archive(tmp_path, members), PREFIX, dest, Caps(max_members=100, max_bytes=1000), where="t"
        )
    assert list(dest.iterdir()) == []


def test_git_pointer_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    members = _good_members()[:1] + [_file(f"{PREFIX}/.git/config")] + _good_members()[2:]
    members.insert(1, _special(f"{PREFIX}/.git", tarfile.DIRTYPE, mode=0o755))
    with pytest.raises(IntegrityError, match="not a plain file"):
        extract_subtree(_archive(tmp_path, members), PREFIX, _dest(tmp_path), CAPS, where="t", drop=(".git",))


def test_archive_without_the_subtree_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path, [_file("pkg-1.0/setup.py")])
    with pytest.raises(IntegrityError, match="no member under"):
        extract_subtree(archive, PREFIX, _dest(tmp_path), CAPS, where="t")


def test_not_a_tarball_is_an_integrity_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"definitely not gzip")
    with pytest.raises(IntegrityError, match="not a readable"):
        extract_subtree(junk, PREFIX, _dest(tmp_path), CAPS, where="t")


def test_destination_must_be_fresh(tmp_path: Path) -> None:
    dest = _dest(tmp_path)
    (dest / "leftover").write_text("x")
    with pytest.raises(IntegrityError, match="not empty"):
        extract_subtree(_archive(tmp_path, _good_members()), PREFIX, dest, CAPS, where="t")


def test_truncated_archive_refuses_before_extraction(tmp_path: Path) -> None:
    members = _good_members() + [_file(f"{PREFIX}/big.bin", bytes(range(256)) * 2000)]
    archive = _archive(tmp_path, members)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    dest = _dest(tmp_path)
    with pytest.raises(IntegrityError, match="corrupt archive"):
        extract_subtree(archive, PREFIX, dest, CAPS, where="t")
    assert list(dest.iterdir()) == []
