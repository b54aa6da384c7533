"""Lane probes against a fake PATH (real executables that print versions), CMake arguments, doctor."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from cli import main as cli
from core.errors import ConfigurationError, ToolchainMissing
from core.workspace import Workspace
from lanes import base, cmake, cpu, cuda, metal, rocm, toolchains, vulkan
from lanes.base import BuildOptions, Status

BANNERS = {
    "cmake": "cmake version 3.25.1\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).",
    "ninja": "1.11.1",
    "make": "GNU Make 4.3",
    "c++": "c++ (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.",
    "cc": "cc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.",
    "ccache": "ccache version 4.8",
    # what the worker links: `pkg-config --exists/--modversion grpc++|protobuf` answer "1.51.1"
    "pkg-config": "1.51.1",
    "protoc": "libprotoc 3.21.12",
    "grpc_cpp_plugin": "",
}


def tool(bindir: Path, name: str, output: str, *, exit_code: int = 0) -> Path:
    """A real executable that prints ``output`` whatever it is asked (a version banner)."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    text = output.replace("'", "'\"'\"'")
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' '{text}'\nexit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    return tmp_path / "bin"


@pytest.fixture
def host(bindir: Path) -> dict[str, str]:
    """An environment whose PATH holds only a complete fake host toolchain."""
    for name, banner in BANNERS.items():
        tool(bindir, name, banner)
    return {"PATH": str(bindir)}


@pytest.fixture(autouse=True)
def no_well_known_locations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Probes also look in fixed system places and the workspace's provisioned toolchains; tests see
    only their own fake PATH and an empty workspace of their own."""
    monkeypatch.setattr(cuda, "WELL_KNOWN_NVCC", ())
    monkeypatch.setattr(cuda, "DRIVER_DIRS", ())
    monkeypatch.setattr(rocm, "WELL_KNOWN_ROOTS", ())
    monkeypatch.setattr(vulkan, "SYSTEM_PREFIXES", ())
    monkeypatch.setattr(vulkan, "LOADER_DIRS", ())
    empty = Workspace(root=tmp_path / "probe-work", cache=tmp_path / "probe-cache")
    monkeypatch.setattr(toolchains, "workspace", lambda env: empty)


TOOLCHAIN_VARS = (
    "CUDACXX",
    "CUDA_HOME",
    "CUDA_PATH",
    "DGR_CUBLAS_ROOT",
    "DGR_CUDA_ARCHITECTURES",
    "ROCM_PATH",
    "HIP_PATH",
    "DGR_HIP_TARGETS",
    "VULKAN_SDK",
    "DGR_VULKAN_SDK",
    "CXX",
    "CC",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """For tests that go through the CLI (which reads os.environ): no toolchain hints from outside."""
    for var in TOOLCHAIN_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# --- host tools / CPU lane -----------------------------------------------------------------------------


def test_cpu_probe_found_records_every_version(host: dict[str, str], bindir: Path) -> None:
    probe = cpu.probe(host)
    assert probe.status is Status.OK and probe.usable
    assert probe.tool == "g++" and probe.version == "12.2.0" and probe.path == str(bindir / "c++")
    assert dict(probe.versions) == {"cmake": "3.25.1", "cxx": "gcc 12.2.0", "cc": "gcc 12.2.0"}
    assert probe.require() is probe


def test_clang_is_recognised(host: dict[str, str], bindir: Path) -> None:
    tool(bindir, "c++", "Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu")
    probe = cpu.probe(host)
    assert probe.tool == "clang++" and probe.versions["cxx"] == "clang 14.0.6"


def test_cmake_too_old_names_the_minimum(host: dict[str, str], bindir: Path) -> None:
    tool(bindir, "cmake", "cmake version 3.13.4")
    probe = cpu.probe(host)
    assert probe.status is Status.TOO_OLD and probe.found and not probe.usable
    assert "cmake 3.13.4" in probe.reason and "install cmake >= 3.19" in probe.reason
    with pytest.raises(ToolchainMissing) as err:
        probe.require()
    assert err.value.exit_code == 4


def test_cmake_missing(host: dict[str, str], bindir: Path) -> None:
    (bindir / "cmake").unlink()
    probe = cpu.probe(host)
    assert probe.status is Status.MISSING and not probe.found
    assert "cmake not found: install cmake" in probe.reason


def test_old_gcc_cannot_do_cxx17(host: dict[str, str], bindir: Path) -> None:
    tool(bindir, "c++", "c++ (GCC) 8.3.0\nCopyright (C) 2018 Free Software Foundation, Inc.")
    probe = cpu.probe(host)
    assert probe.status is Status.TOO_OLD and "g++ 8.3.0" in probe.reason and "g++ >= 9.0" in probe.reason


def test_cxx_from_environment_wins(host: dict[str, str], bindir: Path) -> None:
    special = tool(bindir / "special", "my-g++", "g++ (GCC) 13.1.0\nFree Software Foundation")
    probe = cpu.probe({**host, "CXX": str(special)})
    assert probe.path == str(special) and probe.versions["cxx"] == "gcc 13.1.0"


def test_no_compiler_at_all(host: dict[str, str], bindir: Path) -> None:
    (bindir / "c++").unlink()
    probe = cpu.probe(host)
    assert probe.status is Status.MISSING and "apt-get install g++" in probe.reason


def test_the_c_compiler_is_probed_too(host: dict[str, str], bindir: Path) -> None:
    (bindir / "cc").unlink()
    probe = cpu.probe(host)
    assert probe.status is Status.MISSING and "no gcc or clang found" in probe.reason
    tool(bindir, "cc", "clang version 16.0.0 (https://github.com/llvm/llvm-project)")
    assert cpu.probe(host).versions["cc"] == "clang 16.0.0"


def test_make_when_ninja_is_absent_and_ccache_optional(host: dict[str, str], bindir: Path) -> None:
    (bindir / "ninja").unlink()
    (bindir / "ccache").unlink()
    tools = cmake.probe_host(host)
    assert tools.problem is None and tools.generator == "Unix Makefiles" and tools.ccache is None
    assert tools.generator_version == "4.3" and "make" not in tools.versions
    assert cmake.location_args(tools, llama_source=Path("/t")) == ["-DDGR_LLAMA_SOURCE_DIR=/t"]


def test_ccache_becomes_the_compiler_launcher(host: dict[str, str], bindir: Path) -> None:
    tools = cmake.probe_host(host)
    args = cmake.location_args(tools, llama_source=Path("/t"))
    assert f"-DCMAKE_CXX_COMPILER_LAUNCHER={bindir / 'ccache'}" in args
    assert f"-DCMAKE_C_COMPILER_LAUNCHER={bindir / 'ccache'}" in args


def test_a_failing_version_query_is_not_a_version(host: dict[str, str], bindir: Path) -> None:
    tool(bindir, "cmake", "cmake version 3.25.1", exit_code=1)
    probe = cpu.probe(host)
    assert probe.status is Status.TOO_OLD and "unknown version" in probe.reason


# --- CUDA -------------------------------------------------------------------------------------------------

NVCC_13 = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88"


def toolkit(root: Path, *, cublas: bool = True, stub: bool = False) -> Path:
    """A CUDA toolkit's layout: bin/nvcc, include/, lib64/ (cuBLAS and the driver stub optional)."""
    tool(root / "bin", "nvcc", NVCC_13)
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "lib64").mkdir()
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
        for lib in ("libcublas.so", "libcublasLt.so"):
            (root / "lib64" / lib).write_bytes(b"")
    if stub:
        (root / "lib64" / "stubs").mkdir()
        (root / "lib64" / "stubs" / "libcuda.so").write_bytes(b"")
    return root


def test_cuda_found(host: dict[str, str], tmp_path: Path) -> None:
    tk = toolkit(tmp_path / "cuda")
    env = {**host, "PATH": f"{tk / 'bin'}:{host['PATH']}"}
    probe = cuda.probe(env)
    assert probe.usable and probe.tool == "nvcc" and probe.version == "13.0.88"
    assert probe.versions["nvcc"] == "13.0.88" and probe.versions["cmake"] == "3.25.1"
    assert cuda.environment(env, probe) == {"CUDACXX": str(tk / "bin" / "nvcc"), "CUDAToolkit_ROOT": str(tk)}
    args = cuda.cmake_args(BuildOptions(), probe)
    # No libcuda.so to link (no driver, no stub): the legacy pool; cuBLAS is the toolkit's own.
    assert "-DGGML_CUDA_NO_VMM=ON" in args and not any("cublas" in a for a in args)


def test_cuda_with_the_driver_stub_keeps_vmm(host: dict[str, str], tmp_path: Path) -> None:
    tk = toolkit(tmp_path / "cuda", stub=True)
    probe = cuda.probe({**host, "CUDA_HOME": str(tk)})
    assert probe.usable and probe.path == str(tk / "bin" / "nvcc")
    assert probe.locations["cuda_driver"] == str(tk / "lib64" / "stubs" / "libcuda.so")
    assert "-DGGML_CUDA_NO_VMM=ON" not in cuda.cmake_args(BuildOptions(), probe)


def test_cuda_without_cublas_names_what_to_install(host: dict[str, str], tmp_path: Path) -> None:
    tk = toolkit(tmp_path / "cuda", cublas=False)
    probe = cuda.probe({**host, "CUDA_HOME": str(tk)})
    assert probe.status is Status.MISSING and probe.tool == "cuBLAS"
    assert "cublas_v2.h" in probe.reason and "DGR_CUBLAS_ROOT" in probe.reason


def test_cuda_with_cublas_from_a_wheel(host: dict[str, str], tmp_path: Path) -> None:
    tk = toolkit(tmp_path / "cuda", cublas=False)
    wheel = tmp_path / "site" / "nvidia" / "cu13"  # what `pip install nvidia-cublas` lays out
    (wheel / "include").mkdir(parents=True)
    (wheel / "include" / "cublas_v2.h").write_text("")
    (wheel / "lib").mkdir()
    for lib in ("libcublas.so.13", "libcublasLt.so.13"):
        (wheel / "lib" / lib).write_bytes(b"")
    probe = cuda.probe({**host, "CUDA_HOME": str(tk), "DGR_CUBLAS_ROOT": str(wheel)})
    assert probe.usable
    # Where cuBLAS lives is a location (not in the build key); which version it is, is.
    assert not any("cublas" in a.lower() for a in cuda.cmake_args(BuildOptions(), probe))
    args = cuda.location_args(probe, cmake.probe_host(host))
    assert f"-DCUDA_cublas_LIBRARY={wheel / 'lib' / 'libcublas.so.13'}" in args
    assert f"-DCUDA_cublasLt_LIBRARY={wheel / 'lib' / 'libcublasLt.so.13'}" in args
    assert f"-DCMAKE_CUDA_FLAGS=-I{wheel / 'include'}" in args


def test_cuda_too_old(host: dict[str, str], bindir: Path) -> None:
    tool(bindir, "nvcc", "Cuda compilation tools, release 11.4, V11.4.152")
    probe = cuda.probe(host)
    assert probe.status is Status.TOO_OLD and "nvcc 11.4.152" in probe.reason and ">= 11.8" in probe.reason


def test_cuda_missing(host: dict[str, str]) -> None:
    probe = cuda.probe(host)
    assert probe.status is Status.MISSING and probe.reason.startswith("toolchain not found: nvcc")
    with pytest.raises(ToolchainMissing, match="cuda lane: nvcc"):
        probe.require()


def test_cuda_found_but_host_tools_missing(tmp_path: Path) -> None:
    tk = toolkit(tmp_path / "cuda")
    probe = cuda.probe({"PATH": str(tk / "bin")})
    assert probe.status is Status.MISSING and "cmake not found" in probe.reason


def test_cuda_args_default_and_override() -> None:
    args = cuda.cmake_args(BuildOptions())
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=80;86;89;90" in args
    assert "-DGGML_NATIVE=OFF" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in cuda.cmake_args(BuildOptions(cuda_architectures="90"))
    spaced = cuda.cmake_args(BuildOptions(cuda_architectures="86-real, 90a-virtual"))
    assert "-DCMAKE_CUDA_ARCHITECTURES=86-real;90a-virtual" in spaced


@pytest.mark.parametrize("bad", ["native", "all", "sm_80", "80;x", ""])
def test_cuda_architectures_must_be_explicit(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        cuda.cmake_args(BuildOptions(cuda_architectures=bad or " "))


def test_options_from_env_and_cli_precedence() -> None:
    env = {"DGR_CUDA_ARCHITECTURES": "89", "DGR_HIP_TARGETS": "gfx1100"}
    assert BuildOptions.from_env(env).cuda_architectures == "89"
    assert BuildOptions.from_env(env, cuda_architectures="80").cuda_architectures == "80"
    assert BuildOptions.from_env(env).hip_targets == "gfx1100"
    assert BuildOptions.from_env({}, jobs=3).parallel == 3
    assert BuildOptions.from_env({}).parallel == (os.cpu_count() or 1)
    with pytest.raises(ConfigurationError):
        BuildOptions.from_env({}, jobs=0)


# --- ROCm -------------------------------------------------------------------------------------------------


def test_rocm_debian12_hip_is_too_old(host: dict[str, str], bindir: Path) -> None:
    tool(bindir, "hipconfig", "5.2.21153-0")
    probe = rocm.probe(host)
    assert probe.status is Status.TOO_OLD and "HIP 5.2.21153" in probe.reason and ">= 6.1" in probe.reason


def test_rocm_missing(host: dict[str, str]) -> None:
    probe = rocm.probe(host)
    assert probe.status is Status.MISSING and probe.reason.startswith("toolchain not found: hipcc")


def test_rocm_hipcc_banner_and_missing_libraries(host: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "rocm"
    tool(root / "bin", "hipcc", "HIP version: 6.2.41133-dd7f95766\nAMD clang version 18.0.0")
    env = {**host, "PATH": f"{root / 'bin'}:{host['PATH']}"}
    probe = rocm.probe(env)
    assert probe.status is Status.MISSING and "hipblas and rocblas" in probe.reason
    for lib in ("hipblas", "rocblas"):
        (root / "lib" / "cmake" / lib).mkdir(parents=True)
    probe = rocm.probe(env)
    assert probe.usable and probe.version == "6.2.41133" and probe.versions["hip"] == "6.2.41133-dd7f95766"
    assert rocm.environment(env, probe) == {
        "HIPCXX": str(root / "llvm" / "bin" / "clang"),
        "HIP_PATH": str(root),
        "ROCM_PATH": str(root),
    }


def test_rocm_args() -> None:
    args = rocm.cmake_args(BuildOptions())
    assert "-DGGML_HIP=ON" in args and "-DGPU_TARGETS=gfx90a;gfx942;gfx1030;gfx1100" in args
    assert "-DGPU_TARGETS=gfx1100" in rocm.cmake_args(BuildOptions(hip_targets="gfx1100"))
    with pytest.raises(ConfigurationError):
        rocm.cmake_args(BuildOptions(hip_targets="sm_80"))


# --- Vulkan -----------------------------------------------------------------------------------------------


def vulkan_sdk(root: Path, header: int, *, layer_settings: bool, spirv: bool = True) -> Path:
    inc = root / "include" / "vulkan"
    inc.mkdir(parents=True)
    (inc / "vulkan_core.h").write_text(f"#define VK_HEADER_VERSION {header}\n")
    (inc / "vulkan_structs.hpp").write_text(
        "struct LayerSettingEXT {};\n" if layer_settings else "struct X {};\n"
    )
    if spirv:
        (root / "share" / "cmake" / "SPIRV-Headers").mkdir(parents=True)
        (root / "share" / "cmake" / "SPIRV-Headers" / "SPIRV-HeadersConfig.cmake").write_text("")
    (root / "lib").mkdir()
    (root / "lib" / "libvulkan.so.1").write_bytes(b"")
    tool(root / "bin", "glslc", "shaderc v2025.2 v2025.2\nspirv-tools v2025.1")
    return root


def test_vulkan_debian12_headers_are_too_old(host: dict[str, str], tmp_path: Path) -> None:
    sdk = vulkan_sdk(tmp_path / "sdk", 239, layer_settings=False)
    probe = vulkan.probe({**host, "DGR_VULKAN_SDK": str(sdk)})
    assert probe.status is Status.TOO_OLD and "VK_HEADER_VERSION 239" in probe.reason
    assert "vk::LayerSettingEXT" in probe.reason and "DGR_VULKAN_SDK" in probe.reason


def test_vulkan_new_headers_found_via_the_sdk_hook(host: dict[str, str], tmp_path: Path) -> None:
    sdk = vulkan_sdk(tmp_path / "sdk", 309, layer_settings=True)
    env = {**host, "DGR_VULKAN_SDK": str(sdk)}
    probe = vulkan.probe(env)
    assert probe.usable and probe.versions["vulkan_headers"] == "309"
    assert probe.versions["glslc"].startswith("shaderc v2025.2")
    assert vulkan.environment(env, probe) == {"VULKAN_SDK": str(sdk)}
    assert "-DGGML_VULKAN=ON" in vulkan.cmake_args(BuildOptions())


def test_vulkan_header_version_alone_is_not_enough(host: dict[str, str], tmp_path: Path) -> None:
    sdk = vulkan_sdk(tmp_path / "sdk", 290, layer_settings=False)
    assert vulkan.probe({**host, "DGR_VULKAN_SDK": str(sdk)}).status is Status.TOO_OLD


def test_vulkan_without_spirv_headers(host: dict[str, str], tmp_path: Path) -> None:
    sdk = vulkan_sdk(tmp_path / "sdk", 309, layer_settings=True, spirv=False)
    probe = vulkan.probe({**host, "DGR_VULKAN_SDK": str(sdk)})
    assert probe.status is Status.MISSING and "SPIRV-Headers" in probe.reason


def test_vulkan_missing_glslc_loader_and_headers(
    host: dict[str, str], bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = vulkan.probe(host)
    assert probe.status is Status.MISSING and probe.reason.startswith("toolchain not found: glslc")
    tool(bindir, "glslc", "shaderc v2023.2")
    probe = vulkan.probe(host)
    assert probe.status is Status.MISSING and "libvulkan.so.1" in probe.reason
    assert "apt-get install glslc libvulkan1" in probe.reason
    loader = tmp_path / "lib"
    loader.mkdir()
    (loader / "libvulkan.so.1").write_bytes(b"")
    monkeypatch.setattr(vulkan, "LOADER_DIRS", (str(loader),))
    probe = vulkan.probe(host)
    assert probe.status is Status.MISSING and "vulkan_core.h" in probe.reason
    assert "`dgr build --lane vulkan` provisions" in probe.reason


# --- Metal ------------------------------------------------------------------------------------------------


def test_metal_off_macos(host: dict[str, str]) -> None:
    probe = metal.probe(host, platform="linux")
    assert probe.status is Status.MISSING and "macOS" in probe.reason and "\n" not in probe.reason


def test_metal_on_macos_with_xcode(host: dict[str, str], bindir: Path) -> None:
    # A stand-in xcrun answers both --find metal and --show-sdk-version with one line each.
    tool(bindir, "xcrun", "/Applications/Xcode.app/usr/bin/metal")
    probe = metal.probe(host, platform="darwin")
    assert probe.usable and probe.path == "/Applications/Xcode.app/usr/bin/metal"
    args = metal.cmake_args(BuildOptions())
    assert "-DGGML_METAL=ON" in args and "-DGGML_METAL_EMBED_LIBRARY=ON" in args


# --- all lanes ---------------------------------------------------------------------------------------------


def test_every_lane_has_the_same_surface() -> None:
    for lane in base.all_lanes():
        assert lane.name in base.LANE_NAMES
        for attr in ("probe", "cmake_args", "environment", "certifiable", "targets", "runner_labels"):
            assert hasattr(lane, attr), (lane.name, attr)


def test_args_shared_by_every_lane_avoid_downloads_and_extras() -> None:
    backends = {
        "cpu": None,
        "cuda": "GGML_CUDA",
        "rocm": "GGML_HIP",
        "vulkan": "GGML_VULKAN",
        "metal": "GGML_METAL",
    }
    for lane in base.all_lanes():
        args = lane.cmake_args(BuildOptions())
        for switch in (
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=OFF",
            "-DGGML_CCACHE=OFF",
        ):
            assert switch in args, (lane.name, switch)
        on = [a for a in args if a.endswith("=ON") and a.split("=")[0][2:] in backends.values()]
        assert on == ([f"-D{backends[lane.name]}=ON"] if backends[lane.name] else []), lane.name
    assert "-DGGML_NATIVE=ON" in cpu.cmake_args(BuildOptions(native=True))


def test_unknown_lane_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="unknown lane 'cpux'"):
        base.get("cpux")


def test_doctor_table_lists_all_five_lanes(
    host: dict[str, str], bindir: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tk = toolkit(bindir.parent / "cuda")
    tool(bindir, "hipconfig", "5.2.21153-0")
    clean_env.setenv("PATH", f"{tk / 'bin'}:{host['PATH']}")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["lane", "status", "tool", "version"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert list(rows) == ["cpu", "cuda", "rocm", "vulkan", "metal"]
    assert " ok " in rows["cpu"] and "yes:" in rows["cpu"]
    assert " ok " in rows["cuda"] and "13.0.88" in rows["cuda"]
    assert "too old" in rows["rocm"] and ">= 6.1" in rows["rocm"]
    assert "missing" in rows["vulkan"] and "glslc" in rows["vulkan"]
    if sys.platform != "darwin":
        assert "missing" in rows["metal"] and "macOS" in rows["metal"]


def test_doctor_with_nothing_installed_still_reports(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("PATH", str(tmp_path / "empty"))
    assert cli.main(["doctor", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert [d["lane"] for d in data] == list(base.LANE_NAMES)
    assert all(d["status"] == "missing" and d["reason"] for d in data)
    assert all(d["certifiable"] is False for d in data)


def test_build_of_a_missing_lane_exits_4_before_any_work(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("PATH", str(tmp_path / "empty"))
    clean_env.setenv("DGR_WORK", str(tmp_path / "work"))
    assert cli.main(["build", "--lane", "rocm"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("dgr: toolchain not found: rocm lane: hipcc") and err.count("\n") == 1
    assert not (tmp_path / "work").exists()


def test_build_with_bad_cuda_architectures_exits_2_before_any_work(
    host: dict[str, str], tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tk = toolkit(tmp_path / "cuda")
    clean_env.setenv("PATH", f"{tk / 'bin'}:{host['PATH']}")
    clean_env.setenv("DGR_WORK", str(tmp_path / "work"))
    assert cli.main(["build", "--lane", "cuda", "--cuda-architectures", "native"]) == 2
    assert "invalid CUDA architectures 'native'" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()
