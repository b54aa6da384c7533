"""Issue 20 items 3 and 6: unusable paths and bad settings give one line and exit 2, never a traceback;
malformed-GGUF errors say what to do; disk full says what the whole set still needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.workspace import PROJECT_ROOT
from fetch.gguf_header import MalformedGGUF, read_header
from tests.unit.test_artifacts_store import DISK_FULL_CHILD, LocalSet, local  # noqa: F401 - fixture


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DGR_", "GIT_"))}
    e.update(DGR_WORK=str(tmp_path / "work"), DGR_CACHE=str(tmp_path / "cache"))
    return e


def _dgr(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "certify", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_exit_2(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_store_that_is_a_file(env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("not a folder\n")
    for command in (("provision", "--artifacts", "tiny-llama"), ("certify",), ("verify", str(f))):
        line = _one_line_exit_2(
            _dgr(env, *command, "--store", str(f)), f"store {f} is not a writable directory", "--store DIR"
        )
        assert line.startswith("dgr: configuration error:")
    assert f.read_text() == "not a folder\n"


@pytest.mark.parametrize("store", ["/sys/kernel/dgr-store", "/proc/dgr-store"])
def test_store_under_a_pseudo_filesystem(env: dict[str, str], store: str) -> None:
    _one_line_exit_2(
        _dgr(env, "provision", "--artifacts", "tiny-llama", "--store", store),
        f"store {store} is not a writable directory",
    )


def test_store_on_a_read_only_mount(env: dict[str, str], tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    store = tmp_path / "ro"
    store.mkdir()
    script = (
        f'mount -t tmpfs tmpfs "{store}" && mount -o remount,ro "{store}" && '
        f'exec "{sys.executable}" -m certify provision --artifacts tiny-llama --store "{store}"'
    )
    done = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "mount" in done.stderr and "dgr:" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    _one_line_exit_2(done, f"store {store} is not a writable directory (not writable)")


@pytest.mark.parametrize("name", ["DGR_WORK", "DGR_CACHE"])
def test_workspace_or_cache_that_is_a_file(env: dict[str, str], tmp_path: Path, name: str) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    env[name] = str(f)
    for command in (("fetch",), ("provision",), ("report",)):
        _one_line_exit_2(_dgr(env, *command), f"{name} {f} is not a directory")


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "-0.1"])
def test_lock_wait_must_be_a_finite_non_negative_number(env: dict[str, str], value: str) -> None:
    done = _dgr(env, "provision", "--artifacts", "tiny-llama", f"--lock-wait={value}")
    assert done.returncode == 2 and "--lock-wait" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "name, value, needle",
    [
        ("DGR_SEAMS", "maybe", "DGR_SEAMS='maybe' is not one of off, on"),
        ("DGR_SEAMS_BACKEND", "tc", "DGR_SEAMS_BACKEND='tc'"),
        ("DGR_WORKER_THREADS", "abc", "DGR_WORKER_THREADS='abc' is not a positive integer"),
        ("DGR_WORKER_THREADS", "0", "DGR_WORKER_THREADS='0' is not a positive integer"),
        ("DGR_WORKER_CPUS", "0 x", "DGR_WORKER_CPUS: 'x' is not a CPU list such as 0-3,8"),
        ("DGR_WORKER_CPUS", "0-1,", "DGR_WORKER_CPUS: '0-1,' is not a CPU list"),
        ("DGR_WORKER_LOAD", "mapped", "DGR_WORKER_LOAD='mapped' is not one of none, mmap, mlock"),
        ("DGR_RECIPES_DIR", "FILE", "is not a directory"),
    ],
)
def test_bad_settings_are_refused_at_start(
    env: dict[str, str], tmp_path: Path, name: str, value: str, needle: str
) -> None:
    if value == "FILE":
        value = str(tmp_path / "recipe.json")
        Path(value).write_text("{}")
    env[name] = value
    for command in (("matrix",), ("certify",)):
        _one_line_exit_2(_dgr(env, *command), needle)


def test_malformed_gguf_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not a gguf at all, just text\n")
    with pytest.raises(MalformedGGUF) as caught:
        read_header(path)
    line = caught.value.one_line()
    assert "bad magic" in line and "dgr provision --reverify" in line and "complete .gguf" in line


def test_disk_full_reports_what_the_whole_set_still_needs(local: LocalSet) -> None:  # noqa: F811
    """A real ENOSPC (a 256 KiB tmpfs in a private mount namespace), as in RELIABILITY 11's test."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    local.store.mkdir()
    script = (
        f'mount -t tmpfs -o size=256k tmpfs "{local.store}" && exec "{sys.executable}" -c "$0" '
        f'"{local.store}" "{local.manifests}"'
    )
    done = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, DISK_FULL_CHILD],
        cwd=PROJECT_ROOT,
        env={**local.ctx.env, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    message = out["message"]
    verified = int(message.split(": ", 1)[1].split(" of ", 1)[0])
    need_this = len(local.blobs[1]) - verified
    total = need_this + len(local.blobs[2])  # the third file was not started
    assert f"need {need_this} more bytes for this file, {total} bytes for the whole set" in message, message
