"""A test build of one llama.cpp tree (pristine or patched) for upstream's own suites, CPU only.

The lane builds configure worker/, which adds the patched tree as ``add_subdirectory(... llama)``
with tests off (and refuses a tree without the stage API).  This configures a four-line project that
adds the tree the same way with ``LLAMA_BUILD_TESTS=ON`` and builds only the test executables asked
for; the rest is the CPU lane's: the pipeline switches, static libraries, GGML_NATIVE=OFF, the
identity defines, the ccache launcher.  Both trees are seen through ``<build dir>/llama-src``
(lanes.build.source_link) and objects land under ``llama/`` as in a lane build, so with CCACHE_BASEDIR
at the workspace root every library object is the same compile as the CPU lane's: the patched side
hits the lane build's cache, the pristine side misses only on the files the stack changes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.canonical import canonical_digest, read_json, write_json
from core.clock import utc_now
from core.context import Context
from core.errors import CommandFailed, ToolchainMissing
from core.locks import hold
from lanes import base, cmake
from lanes.build import source_link

# The CPU lane's switches with tests on (the issue: upstream's suites, built the way the lane builds).
TEST_SWITCHES: tuple[tuple[str, str], ...] = tuple(
    (k, "ON" if k == "LLAMA_BUILD_TESTS" else v) for k, v in cmake.PIPELINE_SWITCHES
)
DEFAULT_JOBS = 2
RECORD = "upstream-build.json"


@dataclass(frozen=True, kw_only=True)
class TestBuild:
    side: str  # "pristine" or "patched"
    dir: Path
    tree: Path
    key: str
    configure_s: float
    build_s: float
    error: str = ""  # the build's failure (its binaries are then missing: NOT_BUILT in the table)
    recorded: Mapping[str, Any] = field(default_factory=dict)  # the last call that compiled anything

    def binary(self, target: str) -> Path:
        return self.dir / "bin" / target


# What worker/CMakeLists.txt sets before its add_subdirectory of the tree (the C++ standard reaches
# llama's compile lines), so both compile every library file alike.
PROJECT = """\
cmake_minimum_required(VERSION 3.19)
project(dgr-upstream-tests C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(DGR_LLAMA_SOURCE_DIR "" CACHE PATH "the llama.cpp tree whose tests to build")
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_subdirectory(${DGR_LLAMA_SOURCE_DIR} llama)
"""


def test_args(options: base.BuildOptions, *, commit: str) -> list[str]:
    """The CPU lane's keyed arguments (lanes.cpu + identity) with the tests switched on."""
    args = [cmake.define("CMAKE_BUILD_TYPE", options.build_type)]
    args += [cmake.define(k, v) for k, v in TEST_SWITCHES]
    args.append(cmake.define("GGML_NATIVE", "ON" if options.native else "OFF"))
    return [*args, *cmake.identity_args(lane="cpu", commit=commit)]


def project_dir(root: Path) -> Path:
    """The wrapper project, written once under ``root``."""
    where = root / "project"
    where.mkdir(parents=True, exist_ok=True)
    listing = where / "CMakeLists.txt"
    if not listing.is_file() or listing.read_text() != PROJECT:
        listing.write_text(PROJECT)
    return where


def build_key(*, tree_digest: str, args: Sequence[str], versions: Mapping[str, str]) -> str:
    return canonical_digest({"tree": tree_digest, "cmake_args": list(args), "toolchain": dict(versions)})


def environment(ctx: Context, tree: Path) -> dict[str, str]:
    """The lane's build environment: git stops above the tree, paths hash relative to the workspace."""
    env = dict(ctx.env)
    env["GIT_CEILING_DIRECTORIES"] = os.pathsep.join(
        filter(None, [str(tree.parent), env.get("GIT_CEILING_DIRECTORIES")])
    )
    env.setdefault("CCACHE_BASEDIR", str(ctx.workspace.root))
    return env


def ensure_test_build(
    ctx: Context,
    *,
    side: str,
    tree: Path,
    tree_digest: str,
    commit: str,
    targets: Sequence[str],
    root: Path,
    jobs: int = DEFAULT_JOBS,
    options: base.BuildOptions | None = None,
    say: Callable[[str], None] = lambda _text: None,
) -> TestBuild:
    """Configure (once per key) and build ``targets`` of ``tree`` under ``root/build-SIDE-KEY``.

    ninja makes a rebuild of unchanged targets a no-op, so this is always called; the recorded
    seconds are this call's.
    """
    host = cmake.probe_host(ctx.env)
    if host.problem or host.cmake is None:
        raise ToolchainMissing(f"upstream test build: {host.problem}")
    options = options or base.BuildOptions.from_env(ctx.env)
    args = test_args(options, commit=commit)
    key = build_key(tree_digest=tree_digest, args=args, versions=host.versions)
    where = root / f"build-{side}-{key[:16]}"
    ctx.workspace.ensure(where)
    with hold(root / f"{where.name}.lock", what=f"the test build {where}", wait_s=0):
        return _configure_and_build(
            ctx,
            host,
            side=side,
            tree=tree,
            key=key,
            where=where,
            args=args,
            root=root,
            targets=targets,
            jobs=jobs,
            say=say,
        )


def _configure_and_build(
    ctx: Context,
    host: cmake.HostTools,
    *,
    side: str,
    tree: Path,
    key: str,
    where: Path,
    args: list[str],
    root: Path,
    targets: Sequence[str],
    jobs: int,
    say: Callable[[str], None],
) -> TestBuild:
    env = environment(ctx, tree)
    located = [*args, *cmake.location_args(host, llama_source=source_link(where, tree))]
    configure_s = 0.0
    if not (where / "CMakeCache.txt").is_file():
        say(f"configuring the {side} test build in {where}")
        t0 = time.monotonic()
        cmake.configure(host, source=project_dir(root), build_dir=where, args=located, env=env)
        configure_s = round(time.monotonic() - t0, 3)
    say(f"building {len(targets)} test targets of the {side} tree ({jobs} jobs)")
    t1 = time.monotonic()
    error, compiled = "", True
    try:
        done = cmake.build(host, build_dir=where, targets=list(targets), jobs=jobs, env=env)
        compiled = "no work to do" not in done.output
    except CommandFailed as exc:  # a test that does not compile on one tree is a row, not a crash
        lines = exc.tail.strip().splitlines()
        error = next((x for x in lines if "error" in x or x.startswith("FAILED:")), str(exc))[:300]
    build_s = round(time.monotonic() - t1, 3)
    record = where / RECORD
    if compiled:  # the seconds a real build took stay visible after later no-op calls
        write_json(
            record,
            {
                "side": side,
                "key": key,
                "configure_s": configure_s,
                "build_s": build_s,
                "targets": list(targets),
                "jobs": jobs,
                "error": error,
                "created_at": utc_now(),
            },
        )
    recorded = read_json(record) if record.is_file() else {}
    return TestBuild(
        side=side,
        dir=where,
        tree=tree,
        key=key,
        configure_s=configure_s,
        build_s=build_s,
        error=error,
        recorded=recorded,
    )
