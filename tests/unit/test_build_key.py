"""The build key, the worker-source digest, reuse of a recorded build, binary collection and the lock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.canonical import sha256_file, write_json
from core.context import Context
from core.errors import RuntimeFailure
from lanes import build
from lanes.build import build_key, key_inputs

BASE = {
    "tree_digest": "a" * 40,
    "lane": "cpu",
    "cmake_args": ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF"],
    "versions": {"cmake": "3.25.1", "cxx": "gcc 12.2.0", "ninja": "1.11.1"},
    "worker": "b" * 64,
}


def key_of(**change: object) -> str:
    return build_key(key_inputs(**{**BASE, **change}))  # type: ignore[arg-type]


def test_key_is_stable_and_order_independent() -> None:
    assert key_of() == key_of()
    reordered = dict(reversed(list(BASE["versions"].items())))  # type: ignore[attr-defined]
    assert key_of(versions=reordered) == key_of()
    assert len(key_of()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"tree_digest": "c" * 40},
        {"lane": "cuda"},
        {"cmake_args": ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"]},
        {"cmake_args": ["-DGGML_NATIVE=OFF", "-DCMAKE_BUILD_TYPE=Release"]},  # order matters to CMake
        {"versions": {"cmake": "3.25.1", "cxx": "gcc 12.3.0", "ninja": "1.11.1"}},
        {"versions": {"cmake": "3.25.1", "cxx": "gcc 12.2.0", "ninja": "1.11.1", "nvcc": "13.0.88"}},
        {"worker": "d" * 64},
    ],
)
def test_key_changes_with_each_input(change: dict[str, object]) -> None:
    assert key_of(**change) != key_of()


def test_build_dir_is_named_by_lane_and_key(ctx: Context) -> None:
    key = key_of()
    assert build.build_dir(ctx, "cpu", key) == ctx.workspace.builds / f"cpu-{key[:16]}"


def test_worker_digest_follows_compiled_sources_only(tmp_path: Path) -> None:
    worker = tmp_path / "worker"
    (worker / "src").mkdir(parents=True)
    (worker / "proto").mkdir()
    (worker / "CMakeLists.txt").write_text("project(w)\n")
    (worker / "src" / "main.cpp").write_text("int main() { return 0; }\n")
    (worker / "proto" / "shard.proto").write_text('syntax = "proto3";\n')
    first = build.worker_digest(worker)
    (worker / "client.py").write_text("print('python side')\n")
    (worker / "__pycache__").mkdir()
    (worker / "__pycache__" / "x.bin").write_bytes(b"\0")
    (worker / "README.md").write_text("# the worker: prose, not a build input\n")
    (worker / "fuzz").mkdir()
    (worker / "fuzz" / "pass_port_fuzz.cpp").write_text("// a libFuzzer target: no lane builds it\n")
    assert build.worker_digest(worker) == first
    (worker / "cmake").mkdir()
    (worker / "cmake" / "dgr_proto.cmake").write_text("function(dgr_proto_library name)\nendfunction()\n")
    assert build.worker_digest(worker) != first
    (worker / "cmake" / "dgr_proto.cmake").unlink()
    assert build.worker_digest(worker) == first
    (worker / "src" / "main.cpp").write_text("int main() { return 1; }\n")
    assert build.worker_digest(worker) != first
    (worker / "src" / "main.cpp").write_text("int main() { return 0; }\n")
    assert build.worker_digest(worker) == first
    (worker / "proto" / "shard.proto").write_text('syntax = "proto3"; package x;\n')
    assert build.worker_digest(worker) != first


# --- reuse of a recorded build ---------------------------------------------------------------------


def fake_build(where: Path, key: str) -> dict[str, object]:
    """A build dir as a finished build leaves it: binaries on disk and their identities in build.json."""
    (where / "bin").mkdir(parents=True)
    (where / "src").mkdir()
    exe = where / "bin" / "dgr-shard-worker"
    exe.write_bytes(b"\x7fELF worker")
    exe.chmod(0o755)
    (where / "src" / "libllama.a").write_bytes(b"!<arch> llama")
    binaries = build._collect(where, ("llama", "dgr-shard-worker"))
    prov = {"schema_version": build.SCHEMA_VERSION, "lane": "cpu", "key": key, "binaries": binaries}
    write_json(where / build.RECORD, prov)
    return prov


def test_collect_records_size_mtime_and_sha256(tmp_path: Path) -> None:
    prov = fake_build(tmp_path / "b", "k" * 64)
    rec = prov["binaries"]["dgr-shard-worker"]  # type: ignore[index]
    path = tmp_path / "b" / "bin" / "dgr-shard-worker"
    assert rec == {
        "path": "bin/dgr-shard-worker",
        "size": path.stat().st_size,
        "mtime_ns": path.stat().st_mtime_ns,
        "sha256": sha256_file(path),
    }
    assert prov["binaries"]["libllama.a"]["path"] == "src/libllama.a"  # type: ignore[index]


def test_collect_fails_when_a_target_is_absent(tmp_path: Path) -> None:
    (tmp_path / "b" / "bin").mkdir(parents=True)
    with pytest.raises(RuntimeFailure, match="produced no llama-bench"):
        build._collect(tmp_path / "b", ("llama-bench",))


def test_reuse_when_nothing_changed(tmp_path: Path) -> None:
    where = tmp_path / "b"
    fake_build(where, "k" * 64)
    found = build._reuse(where, "k" * 64, reverify=False)
    assert found is not None and found.reused and found.key == "k" * 64
    assert found.worker == where / "bin" / "dgr-shard-worker"
    assert found.binaries["libllama.a"] == where / "src" / "libllama.a"
    assert build._reuse(where, "x" * 64, reverify=False) is None  # another key: not this build


def test_a_touched_binary_is_removed_so_it_gets_relinked(tmp_path: Path) -> None:
    where = tmp_path / "b"
    fake_build(where, "k" * 64)
    exe = where / "bin" / "dgr-shard-worker"
    st = exe.stat()
    os.utime(exe, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert build._reuse(where, "k" * 64, reverify=False) is None
    assert not exe.exists() and (where / "src" / "libllama.a").exists()


def test_reverify_catches_same_size_same_mtime_tampering(tmp_path: Path) -> None:
    where = tmp_path / "b"
    fake_build(where, "k" * 64)
    lib = where / "src" / "libllama.a"
    st = lib.stat()
    lib.write_bytes(b"!<arch> LLAMA")  # same length, different bytes
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert build._reuse(where, "k" * 64, reverify=False) is not None  # the sidecar is trusted by design
    assert build._reuse(where, "k" * 64, reverify=True) is None
    assert not lib.exists()


@pytest.mark.parametrize("record", ["{not json", '{"schema_version": 99}', "[]"])
def test_a_bad_record_is_never_trusted(tmp_path: Path, record: str) -> None:
    where = tmp_path / "b"
    fake_build(where, "k" * 64)
    (where / build.RECORD).write_text(record)
    assert build._reuse(where, "k" * 64, reverify=False) is None


def test_second_build_of_the_same_dir_fails_fast_naming_the_holder(tmp_path: Path) -> None:
    where = tmp_path / "cpu-0123"
    where.mkdir()
    with build._locked(where):
        with pytest.raises(RuntimeFailure, match=f"pid {os.getpid()}"):
            with build._locked(where):
                pass
    with build._locked(where):  # released: usable again
        pass
