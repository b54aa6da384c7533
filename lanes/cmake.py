"""Shared CMake driving for every lane: the host toolchain probe, the common arguments, configure, build.

Lanes add their backend switches (GGML_CUDA, GGML_HIP, ...) on top of ``common_args``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core import proc
from core.errors import CommandFailed, RuntimeFailure, ToolchainMissing
from lanes import packages
from lanes.base import (
    BuildOptions,
    ToolchainProbe,
    at_least,
    dotted,
    first_line,
    parse_version,
    tool_output,
    which,
)

# The pinned tree says cmake_minimum_required(VERSION 3.14...3.28); worker/CMakeLists.txt needs 3.19
# (string(JSON)).  Backends raise it further (CUDA 3.18, Vulkan 3.19, HIP 3.21).
CMAKE_MINIMUM = (3, 19)

# C++17 with <filesystem> in the standard library (no -lstdc++fs): GCC 9, Clang 10.
CXX_MINIMUM = {"gcc": (9, 0), "clang": (10, 0)}

# A compiler that prints nothing for this long is hung (the longest nvcc units print within minutes).
BUILD_NO_OUTPUT_TIMEOUT_S = 3600.0


@dataclass(frozen=True, kw_only=True)
class HostTools:
    """cmake, the generator, the C/C++ compilers and ccache; ``problem`` says what is missing."""

    cmake: str | None = None
    generator: str | None = None
    generator_version: str | None = None
    cxx: str | None = None
    cxx_id: str | None = None
    cc: str | None = None
    ccache: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    worker: Mapping[str, str] = field(default_factory=dict)  # gRPC/protobuf versions and programs found
    problem: str | None = None
    problem_is_age: bool = False


def _cmake(env: Mapping[str, str], minimum: tuple[int, ...]) -> tuple[str | None, str | None, str | None]:
    path = which("cmake", env)
    if path is None:
        apt = packages.part("cmake").apt
        return None, None, f"cmake not found: install cmake >= {dotted(minimum)} (apt-get install {apt})"
    line = first_line(tool_output(path, ["--version"], env))
    version = parse_version(line)
    if not at_least(version, minimum):
        got = dotted(version) if version else "unknown version"
        return path, None, f"cmake {got} at {path} is too old: install cmake >= {dotted(minimum)}"
    return path, dotted(version), None  # type: ignore[arg-type]


def _generator(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Ninja when present (faster no-op rebuilds), else Unix Makefiles; with the tool's version."""
    for program, generator in (("ninja", "Ninja"), ("make", "Unix Makefiles")):
        path = which(program, env)
        if path:
            version = parse_version(first_line(tool_output(path, ["--version"], env)))
            return generator, dotted(version) if version else "unknown"
    return None, None


def _compiler_id(banner: str) -> str:
    lower = banner.lower()
    if "clang" in lower:
        return "clang"
    if "g++" in lower or "gcc" in lower or "free software foundation" in lower:
        return "gcc"
    return "unknown"


@dataclass(frozen=True, kw_only=True)
class _Compiler:
    var: str  # the environment variable CMake reads first
    names: tuple[str, ...]
    gcc: str
    clang: str


_CXX = _Compiler(var="CXX", names=("c++", "g++", "clang++"), gcc="g++", clang="clang++")
_CC = _Compiler(var="CC", names=("cc", "gcc", "clang"), gcc="gcc", clang="clang")


def _compiler(
    env: Mapping[str, str], kind: _Compiler
) -> tuple[str | None, str | None, str | None, str | None]:
    """(path, id, version, problem) of the compiler CMake will pick (CXX/CC first, like CMake)."""
    wanted = [env[kind.var].split()[0]] if env.get(kind.var, "").strip() else list(kind.names)
    path = next((p for p in (which(w, env) for w in wanted) if p), None)
    if path is None:
        apt = packages.part("c++").apt
        problem = f"no {kind.gcc} or {kind.clang} found: install {kind.gcc} >= 9 (apt-get install {apt})"
        return None, None, None, problem
    output = tool_output(path, ["--version"], env) or ""
    banner = first_line(output) or ""
    cid = _compiler_id(output)
    # "g++ (Debian 12.2.0-14) 12.2.0": the version after the vendor note, not the one inside it.
    version = parse_version(banner.split(")")[-1] if ")" in banner else banner) or parse_version(banner)
    minimum = CXX_MINIMUM.get(cid)
    if minimum is not None and not at_least(version, minimum):
        got = dotted(version) if version else "unknown version"
        name = kind.gcc if cid == "gcc" else kind.clang
        return (
            path,
            cid,
            None,
            f"{name} {got} at {path} is too old for C++17: install {name} >= {dotted(minimum)}",
        )
    return path, cid, dotted(version) if version else "unknown", None


def probe_host(env: Mapping[str, str], *, cmake_minimum: tuple[int, ...] = CMAKE_MINIMUM) -> HostTools:
    """cmake, a build tool, both compilers and what the worker links (gRPC C++, protobuf, their code
    generators).  ``versions`` (the build key's part) holds cmake and the compilers; the generator and
    the gRPC parts are provenance only.  ``problem`` names every part that is missing or too old."""
    problems: list[str] = []
    ages: list[bool] = []
    cmake, cmake_version, problem = _cmake(env, cmake_minimum)
    if problem:
        problems.append(problem)
        ages.append(cmake is not None)
    generator, gen_version = _generator(env)
    if generator is None:
        problems.append(f"no build tool found: install {packages.part('ninja').apt} (or make)")
        ages.append(False)
    versions = {"cmake": str(cmake_version)}
    found: dict[str, str] = {}
    no_cxx = False
    for kind in (_CXX, _CC):
        path, cid, version, problem = _compiler(env, kind)
        if problem:
            if not (no_cxx and path is None):  # no C++ compiler and no C compiler: one package, said once
                problems.append(problem)
                ages.append(path is not None)
            no_cxx = no_cxx or (kind is _CXX and path is None)
            continue
        found[kind.var] = path  # type: ignore[assignment]
        versions[kind.var.lower()] = f"{cid} {version}"
    worker, lacking = worker_parts(env)
    if lacking:
        problems.append(packages.describe(lacking))
        ages.append(False)
    if problems:
        return HostTools(
            cmake=cmake,
            generator=generator,
            problem="; ".join(problems),
            problem_is_age=all(ages),
            worker=worker,
        )
    return HostTools(
        cmake=cmake,
        generator=generator,
        generator_version=gen_version,
        cxx=found["CXX"],
        cxx_id=versions["cxx"].split()[0],
        cc=found["CC"],
        ccache=which("ccache", env),
        versions=versions,
        worker=worker,
    )


# What worker/CMakeLists.txt looks for (pkg_check_modules grpc++ protobuf, protoc, grpc_cpp_plugin),
# and the start of its FATAL_ERROR when it finds less.
WORKER_PARTS = ("pkg-config", "grpc++", "protobuf", "protoc", "grpc_cpp_plugin")
WORKER_DEPS_MISSING = "gRPC/protobuf development files not found"


def _module_version(module: str, env: Mapping[str, str]) -> str | None:
    """pkg-config's version of ``module``; a pkg-config that did not answer is a runtime failure (exit 6),
    never a missing part."""
    try:
        return packages.module_version(module, env)
    except packages.NoAnswer as exc:
        raise RuntimeFailure(str(exc), hint="the machine may be overloaded; run again") from None


def worker_parts(env: Mapping[str, str]) -> tuple[dict[str, str], list[packages.Part]]:
    """(what was found: module versions and program paths, the parts that are missing)."""
    got: dict[str, str] = {}
    lacking: list[packages.Part] = []
    for key in WORKER_PARTS:
        part = packages.part(key)
        if part.module:
            value = _module_version(part.module, env) if "pkg-config" in got else None
        else:
            value = which(part.programs[0], env)
        if value is None:
            lacking.append(part)
        else:
            got[key] = value
    return got, lacking


def merge(probe: ToolchainProbe, host: HostTools) -> ToolchainProbe:
    """A lane probe that also fails when the host tools do (a lane is only ``ok`` if it can build)."""
    from dataclasses import replace

    from lanes.base import Status

    if host.problem and probe.usable:
        status = Status.TOO_OLD if host.problem_is_age else Status.MISSING
        return replace(probe, status=status, reason=host.problem)
    return replace(probe, versions={**host.versions, **probe.versions})


# --- arguments ---------------------------------------------------------------------------------------

# Only what the pipeline needs: the server, its web UI (prebuilt download), tests, examples, the
# unified app and HTTPS are off, so a build never reaches the network.
PIPELINE_SWITCHES: tuple[tuple[str, str], ...] = (
    ("BUILD_SHARED_LIBS", "OFF"),  # static: the worker is one file to hash and ship
    ("LLAMA_BUILD_COMMON", "ON"),
    ("LLAMA_BUILD_TOOLS", "ON"),  # llama-bench, llama-gguf-split, llama-quantize
    ("LLAMA_BUILD_SERVER", "OFF"),
    ("LLAMA_BUILD_UI", "OFF"),
    ("LLAMA_USE_PREBUILT_UI", "OFF"),
    ("LLAMA_BUILD_TESTS", "OFF"),
    ("LLAMA_BUILD_EXAMPLES", "OFF"),
    ("LLAMA_BUILD_APP", "OFF"),
    ("LLAMA_OPENSSL", "OFF"),
    # We pass the compiler launcher ourselves; ggml's own detection would hide it from the record.
    ("GGML_CCACHE", "OFF"),
)


def define(name: str, value: str) -> str:
    return f"-D{name}={value}"


def common_args(options: BuildOptions) -> list[str]:
    """Arguments every lane shares; all of them are part of the build key."""
    args = [define("CMAKE_BUILD_TYPE", options.build_type)]
    args += [define(k, v) for k, v in PIPELINE_SWITCHES]
    args.append(define("GGML_NATIVE", "ON" if options.native else "OFF"))
    return args + sanitizer_args(options.sanitize)


def sanitizer_args(sanitize: str) -> list[str]:
    """-fsanitize for every object and link of the build (libllama, ggml, the worker and its tools), not
    only llama's own LLAMA_SANITIZE_* targets: a report must be able to come from any of them.  Frame
    pointers and debug lines make the reports readable; a UBSan finding stops the process (a report
    nobody reads is no check)."""
    if not sanitize:
        return []
    flags = f"-fsanitize={sanitize} -fno-omit-frame-pointer -fno-sanitize-recover=all -g"
    return [
        define("CMAKE_C_FLAGS", flags),
        define("CMAKE_CXX_FLAGS", flags),
        define("CMAKE_EXE_LINKER_FLAGS", f"-fsanitize={sanitize}"),
        define("CMAKE_SHARED_LINKER_FLAGS", f"-fsanitize={sanitize}"),
    ]


def identity_args(*, lane: str, commit: str) -> list[str]:
    """What the worker reports in Info; build-info would otherwise ask git inside the tree."""
    return [
        define("DGR_LANE", lane),
        define("DGR_LLAMA_COMMIT", commit),
        define("LLAMA_BUILD_COMMIT", commit[:8]),
        define("LLAMA_BUILD_NUMBER", "0"),
    ]


def location_args(host: HostTools, *, llama_source: Path) -> list[str]:
    """Paths and launchers: they do not change the binaries, so they stay out of the build key."""
    args = [define("DGR_LLAMA_SOURCE_DIR", str(llama_source))]
    if host.ccache:
        args += [
            define("CMAKE_C_COMPILER_LAUNCHER", host.ccache),
            define("CMAKE_CXX_COMPILER_LAUNCHER", host.ccache),
        ]
    return args


# --- driving -----------------------------------------------------------------------------------------


def configure(
    host: HostTools, *, source: Path, build_dir: Path, args: Sequence[str], env: Mapping[str, str]
) -> proc.Completed:
    assert host.cmake and host.generator, host.problem
    argv = [host.cmake, "-S", str(source), "-B", str(build_dir), "-G", host.generator, *args]
    try:
        return proc.run(argv, env=env, echo=True, no_output_timeout=BUILD_NO_OUTPUT_TIMEOUT_S)
    except CommandFailed as exc:
        # probe_host looks first; should CMake still find less than it did, that is a toolchain too
        if WORKER_DEPS_MISSING in exc.tail:
            lacking = [packages.part(k) for k in WORKER_PARTS]
            raise ToolchainMissing(
                f"CMake found no usable gRPC/protobuf: {packages.describe(lacking)}",
                hint=f"see {build_dir}/CMakeFiles/CMakeOutput.log",
            ) from None
        raise


def build(
    host: HostTools, *, build_dir: Path, targets: Sequence[str], jobs: int, env: Mapping[str, str]
) -> proc.Completed:
    assert host.cmake
    argv = [host.cmake, "--build", str(build_dir), "--parallel", str(jobs), "--target", *targets]
    return proc.run(argv, env=env, echo=True, no_output_timeout=BUILD_NO_OUTPUT_TIMEOUT_S)
