"""The device bundle's parts without the network: requirement checks, .pc fix, merged-/usr links,
the manifest against tampering, the git snapshot against a dirty checkout, archive parts, the
script's argument handling."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigurationError, IntegrityError
from core.workspace import PROJECT_ROOT
from device import bundle, manifest, snapshot, sysroot, wheels
from tests.conftest import git

SCRIPT = PROJECT_ROOT / "scripts" / "device-cuda.sh"


@pytest.mark.parametrize(
    ("installed", "spec", "ok"),
    [
        ("1.85.1", ">=1.85.1", True),
        ("1.85.3", "<1.86", True),
        ("1.84.0", ">=1.85.1", False),
        ("1.86", "<1.86", False),
        ("1.86.0rc1", "<1.86", False),
        ("1.86.0rc1", ">=1.86", False),
        ("1.85.1", "==1.85.1", True),
        ("1.85.10", "==1.85.1", False),
        ("1.85.0", "==1.85.*", True),
        ("2.11.0+cu130", ">=2.1", True),
        ("7.36.2", "~=7.35", True),
        ("8.0", "~=7.35", False),
        ("4.26.0", "!=4.26.0", False),
    ],
)
def test_specifiers(installed: str, spec: str, ok: bool) -> None:
    assert wheels.matches(installed, spec) is ok


def test_unmet_names_missing_and_wrong_versions() -> None:
    have = {"grpcio": "1.84.0", "numpy": "2.5.2"}

    def version_of(name: str) -> str:
        if name not in have:
            raise importlib.metadata.PackageNotFoundError(name)
        return have[name]

    out = wheels.unmet(["grpcio>=1.85.1,<1.86", "numpy>=1.26", "blake3>=0.4"], version_of)
    assert out == ["grpcio 1.84.0 does not satisfy >=1.85.1,<1.86", "blake3: not installed (need >=0.4)"]


def test_requirements_are_pyprojects_dependencies() -> None:
    reqs = wheels.requirements(PROJECT_ROOT / "pyproject.toml")
    names = {r.split(">")[0].split("=")[0].split("<")[0].strip() for r in reqs}
    assert {"grpcio", "grpcio-tools", "protobuf", "cryptography", "numpy", "pandas", "pip"} <= names
    assert wheels.tag("3.12") == "cp312"
    with pytest.raises(ConfigurationError):
        wheels.tag("pypy3.10")


def test_python_check_exit_codes(tmp_path: Path) -> None:
    """The device script's first question, asked of this interpreter by a real subprocess."""

    def check(deps: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = [{deps}]\n')
        return subprocess.run(
            [sys.executable, "-m", "device", "python-check", "--pyproject", str(tmp_path / "pyproject.toml")],
            capture_output=True,
            text=True,
            cwd=PROJECT_ROOT,
            timeout=60,
        )

    ok = check('"pytest>=1"')
    assert ok.returncode == 0, ok.stdout
    bad = check('"pytest>=1", "no-such-dist-dgr>=1"')
    assert bad.returncode == 4
    assert "no-such-dist-dgr: not installed" in bad.stdout


def _pc(root: Path, name: str, libdir: str) -> Path:
    pc = root / "usr" / "lib" / sysroot.MULTIARCH / "pkgconfig" / name
    pc.parent.mkdir(parents=True, exist_ok=True)
    pc.write_text(f"prefix=/usr\nexec_prefix=${{prefix}}\nlibdir={libdir}\nLibs: -L${{libdir}} -lx\n")
    return pc


def test_fix_pc_points_libdir_at_the_multiarch_directory(tmp_path: Path) -> None:
    grpc = _pc(tmp_path, "grpc.pc", "${exec_prefix}/lib")
    gpr = _pc(tmp_path, "gpr.pc", "${prefix}/lib")
    proto = _pc(tmp_path, "protobuf.pc", "${prefix}/lib/x86_64-linux-gnu")
    before = proto.read_text()
    assert sysroot.fix_pc(tmp_path) == ["gpr.pc", "grpc.pc"]
    assert "libdir=${exec_prefix}/lib/x86_64-linux-gnu\n" in grpc.read_text()
    assert "libdir=${prefix}/lib/x86_64-linux-gnu\n" in gpr.read_text()
    assert proto.read_text() == before
    assert sysroot.fix_pc(tmp_path) == []  # idempotent


def test_merge_usr_moves_lib_and_makes_absolute_links_relative(tmp_path: Path) -> None:
    lib = tmp_path / "lib" / sysroot.MULTIARCH
    lib.mkdir(parents=True)
    (lib / "libz.so.1.2.13").write_bytes(b"\x7fELF")
    (lib / "libz.so.1").symlink_to("libz.so.1.2.13")
    usr_lib = tmp_path / "usr" / "lib" / sysroot.MULTIARCH
    usr_lib.mkdir(parents=True)
    (usr_lib / "libz.so").symlink_to(f"/lib/{sysroot.MULTIARCH}/libz.so.1.2.13")  # zlib1g-dev's
    (tmp_path / "usr" / "bin").mkdir()
    (tmp_path / "usr" / "bin" / "pkgconf").write_bytes(b"#!")
    (tmp_path / "usr" / "bin" / "pkg-config").symlink_to("/usr/bin/pkgconf")
    sysroot.merge_usr(tmp_path)
    assert not (tmp_path / "lib").exists()
    assert os.readlink(usr_lib / "libz.so") == "libz.so.1.2.13"
    assert (usr_lib / "libz.so.1").resolve() == (usr_lib / "libz.so.1.2.13").resolve()
    assert os.readlink(tmp_path / "usr" / "bin" / "pkg-config") == "pkgconf"


@pytest.mark.parametrize("target", ["/etc/passwd", "../../../../outside"])
def test_merge_usr_refuses_links_out_of_the_tree(tmp_path: Path, target: str) -> None:
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "evil").symlink_to(target)
    with pytest.raises(IntegrityError, match="leaves the tree"):
        sysroot.merge_usr(tmp_path)


def _small_bundle(root: Path) -> Path:
    """A bundle with the code the script runs before any install (device, core) and a few files."""
    for package in ("device", "core"):
        shutil.copytree(
            PROJECT_ROOT / package, root / "project" / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    (root / "project" / "scripts").mkdir(parents=True)
    (root / "project" / "scripts" / "run.sh").write_text("#!/bin/sh\n")
    (root / "project" / "scripts" / "run.sh").chmod(0o755)
    (root / "wheels").mkdir()
    (root / "wheels" / "a.whl").write_bytes(b"wheel bytes")
    (root / "sysroot").mkdir()
    (root / "sysroot" / "libx.so").symlink_to("libx.so.1")
    (root / "sysroot" / "libx.so.1").write_bytes(b"lib")
    manifest.write(root, {"project": {"commit": "0" * 40}, "created_at": "now"})
    return root


def test_manifest_of_an_intact_bundle_verifies(tmp_path: Path) -> None:
    doc = manifest.verify(_small_bundle(tmp_path / "b"))
    code = ("project/device/", "project/core/")
    files = {k: v for k, v in doc["files"].items() if not k.startswith(code)}
    assert set(files) == {"project/scripts/run.sh", "wheels/a.whl", "sysroot/libx.so", "sysroot/libx.so.1"}
    assert files["sysroot/libx.so"] == {"link": "libx.so.1"}
    assert files["wheels/a.whl"]["sha256"] == hashlib.sha256(b"wheel bytes").hexdigest()
    assert files["project/scripts/run.sh"]["executable"] is True
    assert doc["total_bytes"] == sum(v.get("size", 0) for v in doc["files"].values())


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: (b / "wheels" / "a.whl").write_bytes(b"wheel bytez"), "content changed: wheels/a.whl"),
        (lambda b: (b / "wheels" / "a.whl").write_bytes(b"wheel"), "size changed: wheels/a.whl"),
        (lambda b: (b / "wheels" / "a.whl").unlink(), "missing: wheels/a.whl"),
        (lambda b: (b / "wheels" / "extra.whl").write_bytes(b"x"), "not in the manifest: wheels/extra.whl"),
        (
            lambda b: ((b / "sysroot" / "libx.so").unlink(), (b / "sysroot" / "libx.so").symlink_to("/etc")),
            "link changed: sysroot/libx.so",
        ),
        (
            lambda b: (b / "project" / "scripts" / "run.sh").chmod(0o644),
            "mode changed: project/scripts/run.sh",
        ),
    ],
)
def test_manifest_names_every_kind_of_damage(tmp_path: Path, damage, reason: str) -> None:
    root = _small_bundle(tmp_path / "b")
    damage(root)
    assert any(p.startswith(reason) for p in manifest.problems(root)), manifest.problems(root)
    with pytest.raises(IntegrityError, match="does not match its manifest"):
        manifest.verify(root)


def test_manifest_refuses_a_folder_that_is_no_bundle(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a device bundle"):
        manifest.verify(tmp_path)
    (tmp_path / manifest.MANIFEST).write_text('{"kind": "something else", "schema_version": 1, "files": {}}')
    with pytest.raises(ConfigurationError, match="not a schema 1 device bundle"):
        manifest.verify(tmp_path)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "device-cuda.sh").write_text("#!/bin/bash\necho committed\n")
    (repo / "scripts" / "device-cuda.sh").chmod(0o755)
    (repo / "README.md").write_text("committed\n")
    git("init", "-q", "-b", "main", str(repo))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    return repo


def test_snapshot_is_head(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "untracked.txt").write_text("never bundled\n")  # untracked: not a reason to refuse
    snap = snapshot.export(repo, tmp_path / "out", dict(os.environ))
    assert snap.commit == git("rev-parse", "HEAD", cwd=repo) and snap.dirty == ()
    assert (tmp_path / "out" / "README.md").read_text() == "committed\n"
    assert os.access(tmp_path / "out" / "scripts" / "device-cuda.sh", os.X_OK)
    assert not (tmp_path / "out" / "untracked.txt").exists()


def test_snapshot_refuses_a_dirty_checkout_unless_allowed(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "README.md").write_text("edited, not committed\n")
    with pytest.raises(ConfigurationError, match=r"1 uncommitted change\(s\) \(README.md\)"):
        snapshot.export(repo, tmp_path / "refused", dict(os.environ))
    assert not (tmp_path / "refused").exists()
    warned: list[str] = []
    snap = snapshot.export(repo, tmp_path / "out", dict(os.environ), allow_dirty=True, warn=warned.append)
    assert snap.dirty == ("README.md",)
    assert "NOT in the bundle" in warned[0] and "README.md" in warned[0]
    assert (tmp_path / "out" / "README.md").read_text() == "committed\n"


def test_split_parts_join_back(tmp_path: Path) -> None:
    data = os.urandom(5 * (1 << 20) + 123)
    whole = tmp_path / "b.tar.xz"
    whole.write_bytes(data)
    parts = bundle.split(whole, 2 << 20)
    assert [p.name for p in parts] == ["b.tar.xz.part000", "b.tar.xz.part001", "b.tar.xz.part002"]
    assert not whole.exists()
    assert b"".join(p.read_bytes() for p in parts) == data
    sums = (tmp_path / "b.tar.xz.sha256").read_text().splitlines()
    assert sums[-1] == f"{hashlib.sha256(data).hexdigest()}  b.tar.xz"
    assert len(sums) == 4


def _script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "OUT"},
    )


def test_script_usage_errors(tmp_path: Path) -> None:
    assert _script("--help", cwd=tmp_path).returncode == 0
    bad = _script("--lane", "rocm", "--bundle", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "--lane must be cuda or cpu" in bad.stderr
    none = _script("--bundle", str(tmp_path), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert none.returncode == 2 and "has no BUNDLE.json" in none.stderr


def test_script_stops_on_a_damaged_bundle(tmp_path: Path) -> None:
    """Exit 3 before anything is set up, with the reason in the log and a summary in the output."""
    root = _small_bundle(tmp_path / "b")
    (root / "wheels" / "a.whl").write_bytes(b"tampered!!!")
    done = _script(
        "--bundle", str(root), "--out", str(tmp_path / "o"), "--work", str(tmp_path / "w"), cwd=tmp_path
    )
    assert done.returncode == 3, done.stdout[-2000:]
    log = (tmp_path / "o" / "log.txt").read_text()
    assert "content changed: wheels/a.whl" in log
    assert (tmp_path / "o" / "results.tar.gz").is_file()
    assert '"step": "bundle-check"' in (tmp_path / "o" / "summary.json").read_text()


def test_a_worker_only_build_is_the_one_certify_reuses(tmp_path: Path) -> None:
    """The device builds WORKER_TARGETS only; `dgr certify` asks ensure_build for the default targets.
    They meet in one build dir only while the targets stay out of the key and out of the reuse check
    (else the device would build the tools after all, inside its 10 minutes)."""
    from device.cli import WORKER_TARGETS
    from lanes import build

    inputs = build.key_inputs(
        tree_digest="t" * 64,
        lane="cuda",
        cmake_args=["-DGGML_CUDA=ON"],
        versions={"nvcc": "13.0.88"},
        worker="w" * 64,
    )
    assert not any("target" in k for k in inputs)
    key = build.build_key(inputs)
    where = tmp_path / f"cuda-{key[:16]}"
    (where / "bin").mkdir(parents=True)
    binaries = {}
    for name in ("dgr-shard-worker", "libllama.a"):
        path = where / ("bin" if name == "dgr-shard-worker" else "") / name
        path.write_bytes(name.encode())
        st = path.stat()
        binaries[name] = {
            "path": path.relative_to(where).as_posix(),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "sha256": hashlib.sha256(name.encode()).hexdigest(),
        }
    (where / build.RECORD).write_text(
        json.dumps(
            {
                "schema_version": build.SCHEMA_VERSION,
                "key": key,
                "lane": "cuda",
                "targets": list(WORKER_TARGETS),
                "binaries": binaries,
            }
        )
    )
    reused = build._reuse(where, key, reverify=False)
    assert reused is not None and reused.worker == where / "bin" / "dgr-shard-worker"


def test_archive_packs_the_folder_and_cuts_it(tmp_path: Path) -> None:
    import tarfile

    root = _small_bundle(tmp_path / "bundle")
    (root / "wheels" / "big.whl").write_bytes(os.urandom(3 << 20))  # not in the manifest: fine here
    parts = bundle._archive(root, bundle.Options(out=root, archive="tar", split_mib=1), log=lambda _: None)
    assert len(parts) == 4 and all(p.stat().st_size <= 1 << 20 for p in parts)
    joined = tmp_path / "joined.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        names = tar.getnames()
        assert tar.getmember("bundle/sysroot/libx.so").issym()
    assert "bundle/BUNDLE.json" in names and "bundle/wheels/big.whl" in names
