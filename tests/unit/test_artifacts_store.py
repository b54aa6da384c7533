"""The store: sidecar trust (RELIABILITY 10), disk full (11), two runs (12), planted links (14), policy."""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core import locks
from core.context import Context
from core.errors import ConfigurationError, IntegrityError, RuntimeFailure
from fetch.download import RetryPolicy
from fetch.ledger import SIDECAR
from fetch.provision import Provisioned, provision
from fetch.store import check_policy, file_lock
from tests.unit.full_disk import run_on_full_disk
from tests.unit.ggufmaker import split_set, write_set
from tests.unit.httpfault import FaultServer

CHUNK = 64 << 10
FAST = RetryPolicy(attempts=3, backoff_s=0.0, timeout_s=5.0)


@dataclass
class LocalSet:
    ctx: Context
    src: Path
    manifests: Path
    store: Path
    blobs: list[bytes]
    names: list[str]

    @property
    def vdir(self) -> Path:
        return self.store / "loc" / "v"

    def run(self, **kw: object) -> Provisioned:
        kw.setdefault("store", self.store)
        return provision(self.ctx, "loc", manifests=self.manifests, policy=FAST, **kw)  # type: ignore[arg-type]


@pytest.fixture
def local(tmp_path: Path, ctx: Context) -> LocalSet:
    blobs = split_set(3, [40000, 70000, 20000])
    entries = write_set(
        tmp_path / "src",
        tmp_path / "m",
        "loc",
        blobs,
        chunk_size=CHUNK,
        origins=[{"kind": "local", "path": str(tmp_path / "src")}],
    )
    return LocalSet(
        ctx=ctx,
        src=tmp_path / "src",
        manifests=tmp_path / "m",
        store=tmp_path / "store",
        blobs=blobs,
        names=[e["name"] for e in entries],
    )


def test_local_origin_copies_with_verification_in_split_order(local: LocalSet) -> None:
    done = local.run()
    assert [p.name for p in done.files] == local.names and done.first.name == local.names[0]
    assert [p.read_bytes() for p in done.files] == local.blobs
    assert done.store == local.vdir and done.set_name == "loc" and done.variant == "v"


def test_local_origin_corruption_is_an_integrity_error_with_the_offset(local: LocalSet) -> None:
    path = local.src / local.names[1]
    data = bytearray(path.read_bytes())
    data[CHUNK + 7] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"chunk 1 at offset {CHUNK}"):
        local.run()
    assert not (local.vdir / local.names[1]).exists()


def test_rerun_over_a_verified_set_costs_a_stat_per_file(local: LocalSet) -> None:
    local.run()
    again = local.run()
    assert (again.reused, again.bytes_hashed, again.bytes_fetched) == (3, 0, 0)
    forced = local.run(reverify=True)
    assert (
        forced.reused == 0 and forced.bytes_hashed == sum(map(len, local.blobs)) and forced.bytes_fetched == 0
    )


def test_case10_corrupt_sidecar_ignored(local: LocalSet) -> None:
    local.run()
    (local.vdir / SIDECAR).write_bytes(b"{not json")
    again = local.run()
    assert again.reused == 0 and again.bytes_hashed == sum(map(len, local.blobs)) and again.bytes_fetched == 0


def test_case10_sidecar_from_another_manifest_ignored(local: LocalSet) -> None:
    local.run()
    path = local.manifests / "loc.json"
    data = json.loads(path.read_text())
    data["description"] = "changed"
    path.write_text(json.dumps(data))
    again = local.run()
    assert again.reused == 0 and again.bytes_hashed == sum(map(len, local.blobs))


def test_case10_stale_sidecar_rehashes_without_refetch(local: LocalSet) -> None:
    local.run()
    target = local.vdir / local.names[0]
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again = local.run()
    assert again.reused == 2 and again.bytes_hashed == len(local.blobs[0]) and again.bytes_fetched == 0


def test_case10_file_changed_under_the_sidecar_is_rehashed_and_repaired(local: LocalSet) -> None:
    local.run()
    target = local.vdir / local.names[2]
    with open(target, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff")
    again = local.run()
    assert again.reused == 2 and again.bytes_fetched == len(local.blobs[2])
    assert target.read_bytes() == local.blobs[2]


def test_case11_preflight_refuses_when_free_space_is_short(local: LocalSet) -> None:
    with pytest.raises(ConfigurationError, match=r"not enough free space .* need \d+ more bytes"):
        local.run(free=lambda path: 1000)
    assert not any(local.vdir.glob("*.gguf"))


DISK_FULL_CHILD = """
import json, sys
from pathlib import Path
from core.context import Context
from core.errors import DgrError
from fetch.provision import provision
store, manifests = Path(sys.argv[1]), Path(sys.argv[2])
out = {}
try:
    provision(Context.from_env(), "loc", store=store, manifests=manifests, free=lambda p: 1 << 40)
except DgrError as exc:
    out = {"kind": type(exc).__name__, "code": exc.exit_code, "message": exc.message}
vdir = store / "loc" / "v"
out["files"] = sorted(p.name for p in vdir.iterdir()) if vdir.exists() else []
out["ledger"] = [p.read_text().count(chr(10)) - 1 for p in sorted(vdir.glob(".*.ledger"))]
print(json.dumps(out))
"""


def test_case11_disk_full_mid_write_stops_keeps_partial_and_reports_bytes_needed(local: LocalSet) -> None:
    """A real ENOSPC: the store is a 256 KiB tmpfs mounted in a private mount namespace."""
    store = local.store
    done = run_on_full_disk(store, DISK_FULL_CHILD, [str(store), str(local.manifests)], local.ctx.env)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["kind"] == "RuntimeFailure" and out["code"] == 6
    assert "disk full writing" in out["message"] and "verified and kept; need" in out["message"]
    assert local.names[0] in out["files"]  # published before the disk filled up
    assert f".{local.names[1]}.part" in out["files"] and local.names[1] not in out["files"]
    assert out["ledger"] and out["ledger"][0] >= 1  # verified chunks kept for the resume


def test_case12_second_run_fails_fast_naming_the_holder(local: LocalSet) -> None:
    local.vdir.mkdir(parents=True)
    with file_lock(local.vdir / local.names[0]):
        with pytest.raises(RuntimeFailure, match=f"being provisioned by pid {os.getpid()} on host"):
            local.run()
    assert not (local.vdir / local.names[0]).exists()
    local.run()


def test_case12_second_run_waits_for_the_holder(local: LocalSet) -> None:
    local.vdir.mkdir(parents=True)
    held = threading.Event()

    def hold() -> None:
        with file_lock(local.vdir / local.names[0]):
            held.set()
            threading.Event().wait(0.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    done = local.run(lock_wait_s=10)
    holder.join()
    assert [p.read_bytes() for p in done.files] == local.blobs


def test_case12_correct_even_when_locks_do_nothing(
    tmp_path: Path, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two concurrent runs sharing one partial (as on a filesystem whose locks are no-ops)."""
    monkeypatch.setattr(locks.fcntl, "flock", lambda fd, op: None)
    blob = split_set(1, [(8 * CHUNK) // 4])[0]
    with FaultServer() as server:
        entries = write_set(
            tmp_path / "src",
            tmp_path / "m",
            "web",
            [blob],
            chunk_size=CHUNK,
            origins=[{"kind": "http", "base_url": server.base_url}],
        )
        server.files[entries[0]["name"]] = blob
        server.faults.delay_per_block = 0.002
        server.faults.flip_offset, server.faults.flip_times = 5 * CHUNK + 3, 1
        results: list[object] = []

        def one() -> None:
            try:
                results.append(
                    provision(ctx, "web", store=tmp_path / "store", manifests=tmp_path / "m", policy=FAST)
                )
            except Exception as exc:  # collected and asserted below
                results.append(exc)

        runs = [threading.Thread(target=one) for _ in range(2)]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
    assert all(isinstance(r, Provisioned) for r in results), results
    final = tmp_path / "store" / "web" / "v" / entries[0]["name"]
    assert final.read_bytes() == blob
    assert not final.with_name(f".{final.name}.part").exists()


def test_case14_symlink_planted_in_the_store_refused(local: LocalSet, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    local.store.mkdir()
    (local.store / "loc").symlink_to(elsewhere)
    with pytest.raises(IntegrityError, match="symbolic link"):
        local.run()
    assert list(elsewhere.iterdir()) == []


def test_case14_symlink_at_a_file_name_refused(local: LocalSet, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    local.vdir.mkdir(parents=True)
    (local.vdir / local.names[0]).symlink_to(victim)
    with pytest.raises(IntegrityError, match="symbolic link"):
        local.run()
    assert victim.read_bytes() == b"keep me"


def test_case14_symlink_at_the_partial_refused(local: LocalSet, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    local.vdir.mkdir(parents=True)
    (local.vdir / f".{local.names[0]}.part").symlink_to(victim)
    with pytest.raises(IntegrityError, match="symbolic link"):
        local.run()
    assert victim.read_bytes() == b"keep me"


def test_mounted_policy_refuses_root_filesystem_and_home(tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match="needs mounted storage; store .* is on the root filesystem"):
        check_policy(tmp_path / "store", "mounted", "big")
    with pytest.raises(IntegrityError, match="is under /home"):
        check_policy(Path("/home/someone/models"), "mounted", "big")
    assert check_policy(tmp_path, "any", "tiny").resolved == tmp_path.resolve()


@pytest.fixture
def other_filesystem() -> Iterator[Path]:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat("/").st_dev:
        pytest.skip("no filesystem other than / to stand in for a mounted volume")
    path = shm / f"dgr-test-{uuid.uuid4().hex}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_mounted_policy_accepts_another_filesystem(local: LocalSet, other_filesystem: Path) -> None:
    path = local.manifests / "loc.json"
    data = json.loads(path.read_text())
    data["storage"] = "mounted"
    path.write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="root filesystem"):
        local.run()
    done = local.run(store=other_filesystem)
    assert [p.read_bytes() for p in done.files] == local.blobs
