"""Issue 20 items 7 and 15 (download parts), against the real loopback fault server.

- An oversized leftover ``.part`` is cut to the manifest size before filling: the published file has
  the manifest's size and digest (it once kept the tail and was published 4 KiB too long).
- 429 and 408 are transient and Retry-After is honoured; 401/403 say they are about access.
- A right-size file that turns out wrong is counted by the free-space preflight.
- A failed generation leaves no staging folder behind, and a dead run's folder is swept.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigurationError, RuntimeFailure
from fetch import provision as provision_mod
from fetch.download import RetryPolicy, retry_after
from tests.unit.test_download_faults import FAST, Served, served  # noqa: F401 - fixture


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_oversized_leftover_part_is_cut_to_the_manifest_size(served: Served) -> None:  # noqa: F811
    """A leftover from an older seal of the same name: its ledger is for another file, its bytes are
    longer.  A fresh in-order fill must not publish the tail."""
    served.final.parent.mkdir(parents=True)
    served.part.write_bytes(served.blob + os.urandom(4096))
    served.ledger.write_text('{"ledger": 1, "identity": "another seal", "validator": {}}\n')
    done = served.run()
    (published,) = done.files
    assert published.stat().st_size == served.size
    assert _sha256(published) == hashlib.sha256(served.blob).hexdigest()
    assert not served.part.exists()


@pytest.mark.parametrize("status", [429, 408, 503])
def test_429_408_are_transient_and_retry_after_is_honoured(served: Served, status: int) -> None:  # noqa: F811
    served.server.faults.status, served.server.faults.status_times = status, 1
    served.server.faults.status_headers = {"Retry-After": "1"}
    started = time.monotonic()
    served.run(RetryPolicy(attempts=3, backoff_s=0.0, timeout_s=5.0))  # no backoff of our own
    assert time.monotonic() - started >= 0.95
    assert [s.status for s in served.server.log][:2] == [status, 206]
    assert served.final.read_bytes() == served.blob


def test_retry_after_is_capped_and_parsed_as_seconds_or_a_date() -> None:
    assert retry_after("7") == 7.0 and retry_after(None) is None and retry_after("soon") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0


@pytest.mark.parametrize("status", [401, 403])
def test_401_403_say_it_is_about_access_not_the_url(served: Served, status: int) -> None:  # noqa: F811
    served.server.faults.status, served.server.faults.status_times = status, 5
    with pytest.raises(RuntimeFailure) as caught:
        served.run()
    line = caught.value.one_line()
    assert f"HTTP {status}" in line and "credentials or access" in line and "check the origin URL" not in line
    assert len(served.server.log) == 1  # never retried


def test_preflight_counts_a_right_size_file_that_turns_out_wrong(served: Served) -> None:  # noqa: F811
    served.final.parent.mkdir(parents=True)
    served.final.write_bytes(b"\0" * served.size)  # right size, wrong bytes, no sidecar
    needed = rf"not enough free space .*{served.size} bytes\) still to fetch"
    with pytest.raises(ConfigurationError, match=needed):
        served.run(free=lambda p: served.size // 2)
    assert served.server.log == []  # refused before any byte was asked for
    served.run(free=lambda p: 2 * served.size)
    assert served.final.read_bytes() == served.blob


def test_failed_generation_leaves_no_staging_folder(
    ctx,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    tmp_path: Path,
) -> None:
    from fetch import source, tinymodel

    class Boom(RuntimeFailure):
        pass

    def fail(out: Path, *args: object, **kw: object) -> None:
        (out / "half-written.gguf").write_bytes(b"x" * 1000)
        raise Boom("generator died")

    monkeypatch.setattr(source, "ensure_pristine", lambda ctx: type("P", (), {"path": tmp_path})())
    monkeypatch.setattr(tinymodel, "generate", fail)
    with pytest.raises(Boom):
        provision_mod.provision(ctx, store=tmp_path / "store", policy=FAST)
    staging = ctx.workspace.staging
    assert not staging.exists() or list(staging.iterdir()) == []


def test_a_staging_folder_that_will_not_go_is_said(
    ctx,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A generated set whose output does not match the seal: the integrity error is what the run ends
    in, and a staging folder the cleanup cannot remove (an unlink failing, which root cannot be made
    to meet here, hence the stand-in) is named in a warning; it was once dropped silently."""
    from core.errors import IntegrityError
    from fetch import source, tinymodel

    def junk(out: Path, *args: object, **kw: object) -> None:
        for i in (1, 2, 3):
            (out / f"tiny-llama-f32-0000{i}-of-00003.gguf").write_bytes(b"x" * 1000)

    def refuse(path: object, *args: object, **kw: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(source, "ensure_pristine", lambda ctx: type("P", (), {"path": tmp_path})())
    monkeypatch.setattr(tinymodel, "generate", junk)
    monkeypatch.setattr(provision_mod.shutil, "rmtree", refuse)
    with caplog.at_level("WARNING", logger="dgr.provision"), pytest.raises((IntegrityError, RuntimeFailure)):
        provision_mod.provision(ctx, store=tmp_path / "store", policy=FAST)
    (kept,) = ctx.workspace.staging.iterdir()
    assert f"-pid{os.getpid()}-" in kept.name
    assert any(f"could not remove the staging folder {kept}" in r.getMessage() for r in caplog.records)


def test_staging_of_a_dead_run_is_swept(ctx) -> None:  # noqa: F811
    staging = ctx.workspace.ensure(ctx.workspace.staging)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    gone = staging / f"tiny-llama-f32-pid{int(dead.stdout)}-abc"
    alive = staging / f"tiny-llama-f32-pid{os.getppid()}-def"
    for d in (gone, alive):
        (d / "split").mkdir(parents=True)
    assert provision_mod.sweep_staging(staging) == [gone]
    assert not gone.exists() and alive.exists()
