"""Issue 14: one list of system packages per lane, read by doctor, `nox -s deps`, .ci/run and CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli import main as cli
from core.errors import ToolchainMissing
from lanes import base, cmake, cpu, packages
from lanes.base import Status
from tests.unit.test_lanes import BANNERS, tool

REPO = Path(__file__).resolve().parents[2]
WORKER_PACKAGES = [
    "pkg-config",
    "libgrpc++-dev",
    "libprotobuf-dev",
    "protobuf-compiler",
    "protobuf-compiler-grpc",
]


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    return tmp_path / "bin"


@pytest.fixture
def host(bindir: Path) -> dict[str, str]:
    for name, banner in {**BANNERS, "git": "git version 2.39.5"}.items():
        tool(bindir, name, banner)
    return {"PATH": str(bindir)}


def pkg_config_without(bindir: Path, *modules: str) -> None:
    """A pkg-config that knows every module but ``modules`` (as one with a .pc file removed)."""
    cases = " ".join(f"{m})" for m in modules)
    script = f'#!/bin/sh\nfor a; do m="$a"; done\ncase "$m" in {cases} exit 1;; esac\necho 3.21.12\n'
    (bindir / "pkg-config").write_text(script)


# --- the list ------------------------------------------------------------------------------------------


def test_every_lane_has_a_group_and_every_lane_brings_the_workers_parts() -> None:
    for lane in base.LANE_NAMES:
        keys = [p.key for p in packages.parts(lane)]
        assert set(cmake.WORKER_PARTS) <= set(keys), lane
        assert {"c++", "cmake", "ninja"} <= set(keys), lane
    assert packages.names(packages.parts("cpu")) == [
        "g++",
        "cmake",
        "ninja-build",
        *WORKER_PACKAGES,
        "git",
        "ccache",
    ]
    assert [p.key for p in packages.parts("cpu") if p.optional] == ["git", "ccache"]
    with pytest.raises(KeyError, match="unknown package group 'cpux'"):
        packages.parts("cpux")


def test_the_command_runs_on_the_bare_standard_library() -> None:
    """.ci/run calls it before anything is installed: no site-packages (-S), no PYTHON* variables (-E)."""
    out = subprocess.run(
        [sys.executable, "-S", "-E", "-m", "lanes.packages", "cpu", "vulkan", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == packages.names(packages.parts("cpu", "vulkan", "tests"))
    assert "chromium" in out.split() and out.count("g++") == 1
    brew = subprocess.run(
        [sys.executable, "-S", "-E", "-m", "lanes.packages", "--brew", "--required", "metal"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert brew == ["cmake", "ninja", "pkgconf", "grpc", "protobuf"]


def test_exit_code_is_the_toolchain_missing_one() -> None:
    assert packages.EXIT_TOOLCHAIN == ToolchainMissing.exit_code == 4


def test_no_other_file_keeps_its_own_list() -> None:
    """README, .ci/run and the workflow name the command, not the packages."""
    for rel in (".ci/run", ".github/workflows/certify.yml", "README.md"):
        text = (REPO / rel).read_text(encoding="utf-8")
        assert "libgrpc++-dev" not in text and "protobuf-compiler-grpc" not in text, rel
        assert "lanes.packages" in text, rel


# --- the probe names each missing part -----------------------------------------------------------------


def test_cpu_probe_names_every_missing_worker_part(host: dict[str, str], bindir: Path) -> None:
    for name in ("protoc", "grpc_cpp_plugin"):
        (bindir / name).unlink()
    pkg_config_without(bindir, "grpc++", "protobuf")
    probe = cpu.probe(host)
    assert probe.status is Status.MISSING
    for what in ("pkg-config grpc++", "pkg-config protobuf", "protoc", "grpc_cpp_plugin"):
        assert what in probe.reason
    assert probe.reason.endswith(
        "(sudo apt-get install -y libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc)"
    )
    with pytest.raises(ToolchainMissing) as err:
        probe.require()
    assert err.value.exit_code == 4


def test_no_pkg_config_means_no_modules_either(host: dict[str, str], bindir: Path) -> None:
    (bindir / "pkg-config").unlink()
    probe = cpu.probe(host)
    assert probe.status is Status.MISSING
    assert "sudo apt-get install -y pkg-config libgrpc++-dev libprotobuf-dev)" in probe.reason


def test_every_missing_host_part_is_named_at_once(host: dict[str, str], bindir: Path) -> None:
    for name in ("cmake", "c++", "cc", "protoc"):
        (bindir / name).unlink()
    reason = cpu.probe(host).reason
    assert "cmake not found" in reason and "no g++ or clang++ found" in reason and "protoc" in reason
    assert "no gcc or clang" not in reason, "one missing compiler package, said once"


def test_a_complete_host_records_the_worker_parts_and_notes_ccache(
    host: dict[str, str], bindir: Path
) -> None:
    probe = cpu.probe(host)
    assert probe.usable and probe.reason is None
    assert probe.locations["grpc++"] == "1.51.1" and probe.locations["protoc"] == str(bindir / "protoc")
    assert "grpc++" not in probe.versions, "the build key is unchanged"
    (bindir / "ccache").unlink()
    probe = cpu.probe(host)
    assert probe.usable
    assert probe.reason == "optional: missing ccache (fast rebuilds) (sudo apt-get install -y ccache)"


def test_every_lane_probe_fails_without_the_worker_parts(host: dict[str, str], bindir: Path) -> None:
    (bindir / "grpc_cpp_plugin").unlink()
    tools = cmake.probe_host(host)
    assert tools.problem and "grpc_cpp_plugin" in tools.problem and not tools.problem_is_age


def test_build_without_grpc_exits_4_before_any_work(
    host: dict[str, str],
    bindir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pkg_config_without(bindir, "grpc++")
    for var in ("CXX", "CC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", host["PATH"])
    monkeypatch.setenv("DGR_WORK", str(tmp_path / "work"))
    assert cli.main(["build", "--lane", "cpu"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("dgr: toolchain not found: cpu lane: missing gRPC C++ development files")
    assert "sudo apt-get install -y libgrpc++-dev" in err and err.count("\n") == 1
    assert not (tmp_path / "work").exists(), "nothing fetched, patched or configured"


def test_cmake_saying_grpc_is_missing_is_a_toolchain_error(
    host: dict[str, str], bindir: Path, tmp_path: Path
) -> None:
    """Should CMake find less than the probe did, configure's FATAL_ERROR is exit 4, not 6."""
    tool(
        bindir,
        "cmake",
        f"CMake Error: {cmake.WORKER_DEPS_MISSING} (need pkg-config modules ...)",
        exit_code=1,
    )
    tools = cmake.HostTools(cmake=str(bindir / "cmake"), generator="Ninja")
    with pytest.raises(ToolchainMissing) as err:
        cmake.configure(tools, source=tmp_path, build_dir=tmp_path / "b", args=[], env=host)
    assert err.value.exit_code == 4 and "libgrpc++-dev" in err.value.message


# --- `nox -s deps`: install as root, else exit 4 with the line -------------------------------------------


class Apt:
    """apt-get as `ensure` runs it; "installing" puts the missing tools on the fake PATH."""

    def __init__(self, bindir: Path, code: int = 0) -> None:
        self.bindir, self.code, self.calls = bindir, code, []

    def __call__(self, argv, *, env, check, **capture):
        self.calls.append(list(argv))
        assert env["DEBIAN_FRONTEND"] == "noninteractive" and capture["stdout"] == subprocess.PIPE
        if "install" in argv:
            for name, banner in BANNERS.items():
                tool(self.bindir, name, banner)
        said = "E: Unable to locate package" if self.code else ""
        return subprocess.CompletedProcess(argv, self.code, stdout=said)


def test_deps_does_nothing_when_everything_is_there(host: dict[str, str], bindir: Path, capsys) -> None:
    apt = Apt(bindir)
    assert packages.ensure(["cpu"], host, run=apt) == 0
    assert apt.calls == [] and capsys.readouterr().out == ""


def test_deps_without_rights_exits_4_with_the_exact_line(
    host: dict[str, str], bindir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for name in ("protoc", "grpc_cpp_plugin", "ccache"):
        (bindir / name).unlink()
    tool(bindir, "apt-get", "")
    tool(bindir, "sudo", "sudo: a password is required", exit_code=1)
    monkeypatch.setattr(packages.os, "geteuid", lambda: 1000)
    apt = Apt(bindir)
    assert packages.ensure(["cpu"], host, run=apt) == 4
    assert apt.calls == [], "nothing was run"
    err = capsys.readouterr().err
    assert "missing protoc, grpc_cpp_plugin; not root and no passwordless sudo" in err
    assert err.rstrip().endswith("sudo apt-get install -y protobuf-compiler protobuf-compiler-grpc ccache")


def test_deps_as_root_updates_once_then_installs_what_is_missing(
    host: dict[str, str], bindir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for name in ("pkg-config", "protoc", "ccache"):
        (bindir / name).unlink()
    apt_get = tool(bindir, "apt-get", "")
    monkeypatch.setattr(packages.os, "geteuid", lambda: 0)
    apt = Apt(bindir)
    assert packages.ensure(["cpu"], host, run=apt) == 0
    assert apt.calls == [
        [str(apt_get), "update", "-qq"],
        [
            str(apt_get),
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "pkg-config",
            "libgrpc++-dev",
            "libprotobuf-dev",
            "protobuf-compiler",
            "ccache",
        ],
    ]
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("deps: installing pkg-config libgrpc++-dev")


def test_deps_with_passwordless_sudo_and_a_failing_install(
    host: dict[str, str], bindir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (bindir / "protoc").unlink()
    tool(bindir, "apt-get", "")
    sudo = tool(bindir, "sudo", "")
    monkeypatch.setattr(packages.os, "geteuid", lambda: 1000)
    apt = Apt(bindir, code=100)
    assert packages.ensure(["cpu"], host, run=apt) == 4
    assert apt.calls[0][:2] == [str(sudo), "-n"] and len(apt.calls) == 1, "update failed: no install"
    err = capsys.readouterr().err
    assert err.startswith("E: Unable to locate package")
    assert "sudo apt-get install -y protobuf-compiler" in err


def test_deps_only_notes_a_missing_optional_part(host: dict[str, str], bindir: Path, capsys) -> None:
    (bindir / "ccache").unlink()
    apt = Apt(bindir)
    assert packages.ensure(["cpu"], host, run=apt) == 0
    assert apt.calls == [] and "optional, not installed: ccache" in capsys.readouterr().out


def test_a_library_part_is_looked_for_as_a_file(tmp_path: Path) -> None:
    runtime = packages.Part(
        key="libfuzzer",
        what="a runtime",
        apt="libclang-rt-dev",
        files=(f"{tmp_path}/llvm-*/lib/*/libfuzz*.a",),
    )
    assert not packages.present(runtime, {"PATH": ""})
    (tmp_path / "llvm-14" / "lib" / "linux").mkdir(parents=True)
    (tmp_path / "llvm-14" / "lib" / "linux" / "libfuzz-x86_64.a").mkdir()  # a folder is not the library
    assert not packages.present(runtime, {"PATH": ""})
    (tmp_path / "llvm-14" / "lib" / "linux" / "libfuzz-x86_64.a").rmdir()
    (tmp_path / "llvm-14" / "lib" / "linux" / "libfuzz-x86_64.a").write_bytes(b"!<arch>\n")
    assert packages.present(runtime, {"PATH": ""})


def test_the_fuzz_group_installs_clang_with_its_runtimes() -> None:
    fuzz = packages.parts("fuzz")
    assert packages.names(fuzz) == ["clang", "libclang-rt-dev"]
    assert all(p.programs or p.files for p in fuzz), "each is looked for, so a missing one is installed"
