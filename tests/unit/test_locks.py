"""Issue 20 item 8: one lock helper (core.locks) for fetch, patch, build, toolchains and the store.

RELIABILITY 14: a link (or hard link) planted at any lock path is refused and the file it points to is
left as it was.  RELIABILITY 12: a holder is named; a record left by a killed holder is stale; where
flock does nothing or is missing the record still keeps a second holder out.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import locks
from core.context import Context
from core.errors import IntegrityError, RuntimeFailure
from core.locks import lock_file
from core.workspace import PROJECT_ROOT
from fetch.source import ensure_pristine
from fetch.store import file_lock
from lanes import build, toolchains
from patches.stack import SERIES_HEADER, ensure_patched, read_series, stack_key

PRECIOUS = b"data that must not become a pid\n"


def _plant(link: Path, tmp_path: Path, *, hard: bool = False) -> Path:
    target = tmp_path / "precious.txt"
    target.write_bytes(PRECIOUS)
    link.parent.mkdir(parents=True, exist_ok=True)
    if hard:
        os.link(target, link)
    else:
        link.symlink_to(target)
    return target


@pytest.mark.parametrize("hard", [False, True], ids=["symlink", "hardlink"])
def test_every_lock_site_refuses_a_planted_link(tmp_path: Path, hard: bool) -> None:
    sites = {
        "source": (tmp_path / "a" / ".x.lock", lambda p: lock_file(p)),
        "build": (tmp_path / "b" / "cpu-1.lock", lambda p: build._locked(p.with_suffix(""))),
        "toolchain": (tmp_path / "c" / "tc.lock", lambda p: toolchains._locked(p.with_suffix(""))),
        "store": (tmp_path / "d" / ".m.gguf.lock", lambda p: file_lock(p.with_name("m.gguf"))),
    }
    for name, (path, take) in sites.items():
        (tmp_path / name).mkdir()
        target = _plant(path, tmp_path / name, hard=hard)
        with pytest.raises(IntegrityError, match="lock file .* (symbolic link|not a plain file)"):
            with take(path):
                pass
        assert target.read_bytes() == PRECIOUS, name


def test_fetch_and_patch_refuse_a_planted_lock_link(ctx: Context, tmp_path: Path, upstream_pin) -> None:
    target = _plant(ctx.workspace.sources / f".llama.cpp-{upstream_pin.short}.lock", tmp_path)
    with pytest.raises(IntegrityError, match="symbolic link"):
        ensure_pristine(ctx, pin=upstream_pin)
    assert target.read_bytes() == PRECIOUS
    (ctx.workspace.sources / f".llama.cpp-{upstream_pin.short}.lock").unlink()
    ensure_pristine(ctx, pin=upstream_pin)

    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "series").write_text(SERIES_HEADER)
    key = stack_key(upstream_pin.tree, read_series(patches))
    (tmp_path / "p").mkdir()
    target = _plant(ctx.workspace.patched / f".{key}.lock", tmp_path / "p")
    with pytest.raises(IntegrityError, match="symbolic link"):
        ensure_patched(ctx, pin=upstream_pin, patches_dir=patches)
    assert target.read_bytes() == PRECIOUS


HOLDER = """
import sys, time
from pathlib import Path
from core.locks import hold
with hold(Path(sys.argv[1]), what="the target"):
    print("held", flush=True)
    time.sleep(60)
"""


def _child_holding(path: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        cwd=PROJECT_ROOT,
        text=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_second_holder_fails_fast_naming_the_first_and_waits_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "t.lock"
    child = _child_holding(path)
    try:
        with pytest.raises(RuntimeFailure, match=f"the target is held by pid {child.pid} on host"):
            with locks.hold(path, what="the target", wait_s=0):
                pass
        assert locks.holder_text(path).startswith(f"pid {child.pid} ")
    finally:
        child.kill()
        child.communicate()
    with locks.hold(path, what="the target", wait_s=2):  # released by the kill
        assert locks.holder_text(path).startswith(f"pid {os.getpid()} ")
    assert locks.holder_text(path) == "an unknown holder"  # cleared to 'free' on release


def test_where_flock_does_nothing_the_record_keeps_a_live_holder_exclusive_and_a_dead_one_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.lock"
    child = _child_holding(path)
    monkeypatch.setattr(locks.fcntl, "flock", lambda fd, op: None)  # a filesystem whose locks are no-ops
    try:
        with pytest.raises(RuntimeFailure, match=f"held by pid {child.pid}"):
            with locks.hold(path, what="the target", wait_s=0.3, poll_s=0.05):
                pass
    finally:
        child.send_signal(signal.SIGKILL)  # kill -9: its record stays behind, naming a dead pid
        child.communicate()
    assert locks.holder_text(path).startswith(f"pid {child.pid} ")
    started = time.monotonic()
    with locks.hold(path, what="the target", wait_s=0):  # stale: taken over at once
        assert locks.holder_text(path).startswith(f"pid {os.getpid()} ")
    assert time.monotonic() - started < 1


def test_a_filesystem_without_flock_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", no_locks)
    for take in (lambda p: lock_file(p), lambda p: build._locked(p.with_suffix(""))):
        with take(tmp_path / "x.lock"):
            pass


def test_a_reused_pid_is_not_a_live_holder() -> None:
    """The record carries the pid's start time: another process under the same pid is not the holder."""
    me = locks.parse_holder(locks._record("t"))
    assert me is not None and me.live_here()
    other = locks.Holder(pid=me.pid, started="1", host=me.host, since=me.since, token="t")
    assert not other.live_here() or sys.platform != "linux"
