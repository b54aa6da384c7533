"""Provisioned lane toolchains: pins, digest checks, safe extraction, the stamp, the lanes' use of them.

Downloads are real files handed over by a stand-in downloader (the package index is not reached);
.deb files are built with the real dpkg-deb.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from cli import main as cli
from core.errors import ConfigurationError, IntegrityError, ToolchainMissing
from core.workspace import Workspace
from lanes import base, cmake, cuda, toolchains, vulkan
from lanes.base import BuildOptions, Status
from tests.unit.test_lanes import BANNERS, NVCC_13, tool


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_wheel(path: Path, members: Mapping[str, bytes], *, link: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    return path


CUBLAS_MEMBERS = {
    "nvidia/cu13/include/cublas_v2.h": b"",
    "nvidia/cu13/include/cublas_api.h": b"#define CUBLAS_VER_MAJOR 13\n#define CUBLAS_VER_MINOR 0\n"
    b"#define CUBLAS_VER_PATCH 2\n#define CUBLAS_VER_BUILD 14\n",
    "nvidia/cu13/lib/libcublas.so.13": b"\x7fELF",
    "nvidia/cu13/lib/libcublasLt.so.13": b"\x7fELF",
    "nvidia_cublas-13.0.2.14.dist-info/METADATA": b"Name: nvidia-cublas\n",
}


def write_pin(directory: Path, name: str, files: list[Path], **extra: object) -> Path:
    """A manifest for ``files`` (real sizes and digests) written where the loader reads it."""
    data = {
        "schema_version": 1,
        "name": name,
        "version": "13.0.2.14",
        "kind": "wheel",
        "lane": "cuda",
        "description": "a test toolchain",
        "root": "nvidia/cu13",
        "files": [
            {
                "package": f.name.split("_")[0].split("-")[0],
                "version": "13.0.2.14",
                "filename": f.name,
                "size": f.stat().st_size,
                "sha256": sha(f),
            }
            for f in files
        ],
        **extra,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(data))
    return directory / f"{name}.json"


def pin(directory: Path, name: str, files: list[Path], **extra: object) -> toolchains.Toolchain:
    write_pin(directory, name, files, **extra)
    return toolchains.load(name, directory=directory)


class Shelf:
    """A stand-in package index: hands over the files it holds and counts the downloads."""

    def __init__(self, *files: Path) -> None:
        self.files = {f.name: f for f in files}
        self.calls: list[str] = []

    def __call__(self, env: Mapping[str, str], tc: object, pinned: toolchains.PinnedFile, into: Path) -> None:
        self.calls.append(pinned.filename)
        shutil.copy(self.files[pinned.filename], into / pinned.filename)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(root=tmp_path / "work", cache=tmp_path / "cache")


# --- the pinned manifests -----------------------------------------------------------------------------


def test_every_pinned_toolchain_validates_and_names_real_digests() -> None:
    names = sorted(p.stem for p in toolchains.TOOLCHAINS.glob("*.json"))
    assert names == ["cublas-cu13", "grpc-debian12", "vulkan-headers-debian13"]
    for name in names:
        tc = toolchains.load(name)
        assert tc.files and all(len(f.sha256) == 64 and f.size > 0 for f in tc.files)
        assert len({f.sha256 for f in tc.files}) == len(tc.files)
    assert toolchains.load("vulkan-headers-debian13").suite == "trixie"
    assert toolchains.load("grpc-debian12").suite == "bookworm"  # the device bundle's sysroot
    cublas = toolchains.load("cublas-cu13")
    assert cublas.files[0].package == "nvidia-cublas" and cublas.files[0].version == cublas.version


def test_a_typo_in_a_toolchain_manifest_is_named(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    write_pin(tmp_path / "pins", "t", [wheel], sutie="trixie")
    with pytest.raises(ConfigurationError, match="unknown key 'sutie'.*did you mean 'suite'"):
        toolchains.load("t", directory=tmp_path / "pins")


# --- provisioning -------------------------------------------------------------------------------------


def test_provision_verifies_extracts_and_stamps_then_is_a_no_op(tmp_path: Path, ws: Workspace) -> None:
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    tc = pin(tmp_path / "pins", "cublas-test", [wheel])
    shelf = Shelf(wheel)
    assert toolchains.installed(ws, tc) is None
    root = toolchains.ensure(ws, {}, tc, download=shelf, log=lambda _: None)
    assert root == ws.root / "toolchains" / "cublas-test-13.0.2.14" / "nvidia" / "cu13"
    assert (root / "lib" / "libcublas.so.13").read_bytes() == b"\x7fELF"
    assert toolchains.installed(ws, tc) == root
    assert toolchains.ensure(ws, {}, tc, download=shelf, log=lambda _: None) == root
    assert shelf.calls == [wheel.name]  # the second run trusted the stamp
    assert [p.name for p in root.parents[2].iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_wrong_digest_is_refused_and_nothing_is_installed(tmp_path: Path, ws: Workspace) -> None:
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    tc = pin(tmp_path / "pins", "cublas-test", [wheel])
    evil = make_wheel(tmp_path / "evil" / wheel.name, {**CUBLAS_MEMBERS, "nvidia/cu13/lib/x": b"1"})
    with pytest.raises(IntegrityError, match="the pin says size .* sha256 .*discarded") as err:
        toolchains.ensure(ws, {}, tc, download=Shelf(evil), log=lambda _: None)
    assert err.value.exit_code == 3
    assert toolchains.installed(ws, tc) is None
    assert not toolchains.install_dir(ws, tc).exists()


def test_an_install_from_another_pin_is_replaced(tmp_path: Path, ws: Workspace) -> None:
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    tc = pin(tmp_path / "pins", "cublas-test", [wheel])
    toolchains.ensure(ws, {}, tc, download=Shelf(wheel), log=lambda _: None)
    planted = toolchains.install_dir(ws, tc) / "nvidia" / "cu13" / "planted"
    planted.write_text("x")
    stamp = toolchains.install_dir(ws, tc) / toolchains.STAMP
    stamp.write_text(json.dumps({"manifest_digest": "0" * 64}))  # a stamp of some other pin
    assert toolchains.installed(ws, tc) is None
    toolchains.ensure(ws, {}, tc, download=Shelf(wheel), log=lambda _: None)
    assert toolchains.installed(ws, tc) is not None and not planted.exists()


def test_a_failing_download_is_exit_4_naming_what_to_install(tmp_path: Path, ws: Workspace) -> None:
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    tc = pin(tmp_path / "pins", "cublas-test", [wheel])

    def offline(env: Mapping[str, str], tc: object, pinned: object, into: Path) -> None:
        from core import proc

        proc.run([shutil.which("false") or "false"], env={"PATH": "/usr/bin:/bin"})

    with pytest.raises(ToolchainMissing, match="could not download nvidia==13.0.2.14") as err:
        toolchains.ensure(ws, {}, tc, download=offline, log=lambda _: None)
    assert "install a test toolchain by hand" in err.value.one_line()


def test_a_pin_for_another_machine_is_refused(tmp_path: Path, ws: Workspace) -> None:
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    tc = pin(tmp_path / "pins", "cublas-test", [wheel], machine="sparc64")
    with pytest.raises(ToolchainMissing, match="is for sparc64"):
        toolchains.ensure(ws, {}, tc, download=Shelf(wheel), log=lambda _: None)


@pytest.mark.parametrize("bad", ["../escape.h", "/etc/x", "nvidia/../../x"])
def test_wheel_members_outside_the_tree_are_refused(tmp_path: Path, bad: str) -> None:
    wheel = make_wheel(tmp_path / "bad.whl", {"nvidia/ok.h": b"", bad: b"x"})
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(IntegrityError, match="unsafe member name"):
        toolchains.extract_wheel(wheel, dest)
    assert list(dest.iterdir()) == []


def test_wheel_links_are_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "bad.whl", {"nvidia/ok.h": b""}, link="nvidia/passwd")
    with pytest.raises(IntegrityError, match="not a plain file"):
        toolchains.extract_wheel(wheel, tmp_path)


def build_deb(tmp_path: Path, name: str, files: Mapping[str, bytes], links: Mapping[str, str] = {}) -> Path:
    root = tmp_path / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    )
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    for rel, target in links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(target)
    out = tmp_path / f"{name}_1.0-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-b", str(root), str(out)], check=True, capture_output=True
    )
    return out


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")


@needs_dpkg
def test_debs_are_extracted_with_relative_links_kept(tmp_path: Path, ws: Workspace) -> None:
    header = {"usr/include/vulkan/vulkan_core.h": b"#define VK_HEADER_VERSION 309\n"}
    deb = build_deb(tmp_path, "hdrs", header, {"usr/lib/libvulkan.so": "libvulkan.so.1"})
    tc = pin(tmp_path / "pins", "hdrs", [deb], kind="deb", root="usr", lane="vulkan", suite="trixie")
    root = toolchains.ensure(ws, {"PATH": "/usr/bin:/bin"}, tc, download=Shelf(deb), log=lambda _: None)
    assert (root / "include" / "vulkan" / "vulkan_core.h").is_file()
    assert (root / "lib" / "libvulkan.so").is_symlink()


@needs_dpkg
def test_a_deb_link_leaving_the_tree_is_refused(tmp_path: Path, ws: Workspace) -> None:
    deb = build_deb(tmp_path, "evil", {"usr/include/x.h": b""}, {"usr/include/y.h": "../../../../etc/passwd"})
    tc = pin(tmp_path / "pins", "evil", [deb], kind="deb", root="usr", lane="vulkan", suite="trixie")
    with pytest.raises(IntegrityError, match="leaves the tree"):
        toolchains.ensure(ws, {"PATH": "/usr/bin:/bin"}, tc, download=Shelf(deb), log=lambda _: None)
    assert not toolchains.install_dir(ws, tc).exists()


# --- which Debian archive apt-get download uses -----------------------------------------------------


def test_debian_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /k.gpg\n"
    )
    assert toolchains.debian_mirror({}, (tmp_path / "none", d)) == ("http://mirror.example/debian", "/k.gpg")
    one = tmp_path / "sources.list"
    one.write_text("# comment\ndeb [arch=amd64 signed-by=/o.gpg] http://other.example/debian bookworm main\n")
    assert toolchains.debian_mirror({}, (one,)) == ("http://other.example/debian", "/o.gpg")
    assert toolchains.debian_mirror({}, (tmp_path / "none",)) is None
    env = {"DGR_DEBIAN_MIRROR": "http://mine.example/debian"}
    assert toolchains.debian_mirror(env, (one,))[0] == "http://mine.example/debian"


# --- the lanes use what they provisioned ----------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    for name, banner in BANNERS.items():
        tool(bindir, name, banner)
    return {"PATH": str(bindir)}


def test_cuda_provisions_cublas_when_the_toolkit_lacks_it(
    host: dict[str, str], tmp_path: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    tk = tmp_path / "cuda"
    tool(tk / "bin", "nvcc", NVCC_13)
    (tk / "include").mkdir()
    (tk / "include" / "cuda_runtime.h").write_text("")
    monkeypatch.setattr(cuda, "WELL_KNOWN_NVCC", ())
    monkeypatch.setattr(cuda, "DRIVER_DIRS", ())
    monkeypatch.setattr(toolchains, "workspace", lambda env: ws)
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    pin(tmp_path / "pins", "cublas-cu13", [wheel])
    monkeypatch.setattr(toolchains, "TOOLCHAINS", tmp_path / "pins")
    monkeypatch.setattr(toolchains, "DOWNLOADERS", {"wheel": Shelf(wheel)})
    env = {**host, "CUDA_HOME": str(tk)}

    missing = cuda.probe(env)
    assert missing.status is Status.MISSING and "provisions the pinned nvidia==13.0.2.14" in missing.reason
    found = cuda.provision(ws, env, missing)
    assert found.usable and found.versions["cublas"] == "13.0.2.14" and found.versions["nvcc"] == "13.0.88"
    provisioned = ws.root / "toolchains" / "cublas-cu13-13.0.2.14" / "nvidia" / "cu13"
    assert found.locations["cublas_include"] == str(provisioned / "include")
    args = cuda.location_args(found, cmake.probe_host(host))
    assert f"-DCUDA_cublas_LIBRARY={provisioned / 'lib' / 'libcublas.so.13'}" in args
    assert f"-DCMAKE_CUDA_COMPILER_LAUNCHER={tmp_path / 'bin' / 'ccache'}" in args
    key_args = cuda.cmake_args(BuildOptions(cuda_architectures="90"), found)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in key_args and "-DGGML_CUDA_NO_VMM=ON" in key_args
    assert not any(str(ws.root) in a for a in key_args)  # the key never names the workspace


def test_cuda_toolkit_of_a_major_without_a_pin_says_what_to_install(
    host: dict[str, str], tmp_path: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    tk = tmp_path / "cuda"
    tool(tk / "bin", "nvcc", "Cuda compilation tools, release 12.4, V12.4.131")
    (tk / "include").mkdir()
    (tk / "include" / "cuda_runtime.h").write_text("")
    monkeypatch.setattr(cuda, "WELL_KNOWN_NVCC", ())
    monkeypatch.setattr(toolchains, "workspace", lambda env: ws)
    probe = cuda.probe({**host, "CUDA_HOME": str(tk)})
    assert probe.status is Status.MISSING and "provisions" not in probe.reason
    assert "libcublas-dev" in probe.reason
    assert cuda.provision(ws, {**host, "CUDA_HOME": str(tk)}, probe) is probe


@needs_dpkg
def test_vulkan_provisions_newer_headers_beside_the_systems_glslc_and_loader(
    host: dict[str, str], tmp_path: Path, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "usr"
    (system / "include" / "vulkan").mkdir(parents=True)
    (system / "include" / "vulkan" / "vulkan_core.h").write_text("#define VK_HEADER_VERSION 239\n")
    (system / "lib").mkdir()
    (system / "lib" / "libvulkan.so.1").write_bytes(b"")
    tool(tmp_path / "bin", "glslc", "shaderc 2023.2-1\nspirv-tools 2022.4")
    monkeypatch.setattr(vulkan, "SYSTEM_PREFIXES", (str(system),))
    monkeypatch.setattr(vulkan, "LOADER_DIRS", (str(system / "lib"),))
    monkeypatch.setattr(toolchains, "workspace", lambda env: ws)
    headers = build_deb(
        tmp_path,
        "libvulkan-dev",
        {
            "usr/include/vulkan/vulkan_core.h": b"#define VK_HEADER_VERSION 309\n",
            "usr/include/vulkan/vulkan_structs.hpp": b"struct LayerSettingEXT {};\n",
        },
    )
    spirv_cmake = "usr/share/cmake/SPIRV-Headers"
    spirv = build_deb(
        tmp_path,
        "spirv-headers",
        {
            f"{spirv_cmake}/SPIRV-HeadersConfig.cmake": b"",
            f"{spirv_cmake}/SPIRV-HeadersConfigVersion.cmake": b'set(PACKAGE_VERSION "1.5.5")\n',
        },
    )
    pin(
        tmp_path / "pins",
        "vulkan-headers-debian13",
        [headers, spirv],
        kind="deb",
        root="usr",
        lane="vulkan",
        suite="trixie",
        version="1.4.309",
    )
    monkeypatch.setattr(toolchains, "TOOLCHAINS", tmp_path / "pins")
    monkeypatch.setattr(toolchains, "DOWNLOADERS", {"deb": Shelf(headers, spirv)})
    env = {**host, "PATH": f"{host['PATH']}:/usr/bin:/bin"}

    old = vulkan.probe(env)
    assert old.status is Status.TOO_OLD and "VK_HEADER_VERSION 239" in old.reason
    assert "`dgr build --lane vulkan` provisions Debian 13's" in old.reason
    found = vulkan.provision(ws, env, old)
    assert found.usable, found.reason
    assert found.versions["vulkan_headers"] == "309" and found.versions["spirv_headers"] == "1.5.5"
    assert found.versions["glslc"] == "shaderc 2023.2-1"
    root = ws.root / "toolchains" / "vulkan-headers-debian13-1.4.309" / "usr"
    assert vulkan.location_args(found, cmake.probe_host(env)) == [
        f"-DVulkan_INCLUDE_DIR={root / 'include'}",
        f"-DVulkan_LIBRARY={system / 'lib' / 'libvulkan.so.1'}",
        f"-DVulkan_GLSLC_EXECUTABLE={tmp_path / 'bin' / 'glslc'}",
        f"-DSPIRV-Headers_DIR={root / 'share' / 'cmake' / 'SPIRV-Headers'}",
    ]
    assert vulkan.environment(env, found) == {}  # no SDK: explicit paths, not VULKAN_SDK
    assert vulkan.cmake_args(BuildOptions(), found) == vulkan.cmake_args(BuildOptions())


def test_build_provisions_before_it_requires_and_fails_with_exit_4_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dgr build --lane cuda` on a toolkit without cuBLAS tries the pinned wheel; offline: exit 4."""
    bindir = tmp_path / "bin"
    for name, banner in BANNERS.items():
        tool(bindir, name, banner)
    tk = tmp_path / "cuda"
    tool(tk / "bin", "nvcc", NVCC_13)
    (tk / "include").mkdir()
    (tk / "include" / "cuda_runtime.h").write_text("")
    monkeypatch.setattr(cuda, "WELL_KNOWN_NVCC", ())
    for var in ("CUDACXX", "CUDA_PATH", "DGR_CUBLAS_ROOT", "DGR_CUDA_ARCHITECTURES", "CXX", "CC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("CUDA_HOME", str(tk))
    monkeypatch.setenv("DGR_WORK", str(tmp_path / "work"))
    wheel = make_wheel(tmp_path / "w" / "nvidia_cublas-13.0.2.14-py3-none-any.whl", CUBLAS_MEMBERS)
    pin(tmp_path / "pins", "cublas-cu13", [wheel])
    monkeypatch.setattr(toolchains, "TOOLCHAINS", tmp_path / "pins")
    calls: list[str] = []

    def offline(env: Mapping[str, str], tc: object, pinned: toolchains.PinnedFile, into: Path) -> None:
        calls.append(pinned.filename)
        from core import proc

        proc.run(["/bin/false"], env={"PATH": "/bin"})

    monkeypatch.setattr(toolchains, "DOWNLOADERS", {"wheel": offline})
    assert cli.main(["build", "--lane", "cuda", "--cuda-architectures", "90"]) == 4
    err = capsys.readouterr().err
    assert "dgr: toolchain not found: cuda lane: could not download nvidia==13.0.2.14" in err
    assert err.splitlines()[-1].startswith("dgr: ") and len(err.splitlines()) == 2  # progress + one error
    assert calls == [wheel.name]
    assert base.get("cuda") is cuda
