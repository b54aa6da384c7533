"""A test build of one llama.cpp tree (pristine or patched) for upstream's own suites, CPU only.

Unlike a lane build (worker/ on top, tests off), this configures the llama.cpp tree itself as the
top-level project with ``LLAMA_BUILD_TESTS=ON`` and builds only the test executables asked for.
Everything else is the CPU lane's: the pipeline switches, static libraries, GGML_NATIVE=OFF, the
ccache launcher.  Both trees are seen through ``<build dir>/llama-src`` (lanes.build.source_link), so
with CCACHE_BASEDIR at the workspace root the second tree's unchanged files (all of ggml/, common/ and
most of src/) are cache hits of the first's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.canonical import canonical_digest
from core.context import Context
from core.errors import CommandFailed, ToolchainMissing
from lanes import base, cmake
from lanes.build import source_link

# The CPU lane's switches with tests on (the issue: upstream's suites, built the way the lane builds).
TEST_SWITCHES: tuple[tuple[str, str], ...] = tuple(
    (k, "ON" if k == "LLAMA_BUILD_TESTS" else v) for k, v in cmake.PIPELINE_SWITCHES
)
DEFAULT_JOBS = 2


@dataclass(frozen=True, kw_only=True)
class TestBuild:
    side: str  # "pristine" or "patched"
    dir: Path
    tree: Path
    key: str
    configure_s: float
    build_s: float
    error: str = ""  # the build's failure (its binaries are then missing: NOT_BUILT in the table)

    def binary(self, target: str) -> Path:
        return self.dir / "bin" / target


def test_args(options: base.BuildOptions, *, commit: str) -> list[str]:
    args = [cmake.define("CMAKE_BUILD_TYPE", options.build_type)]
    args += [cmake.define(k, v) for k, v in TEST_SWITCHES]
    args.append(cmake.define("GGML_NATIVE", "ON" if options.native else "OFF"))
    args += [cmake.define("LLAMA_BUILD_COMMIT", commit[:8]), cmake.define("LLAMA_BUILD_NUMBER", "0")]
    return args


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
    env = environment(ctx, tree)
    launcher = [a for a in cmake.location_args(host, llama_source=tree) if "LAUNCHER" in a]
    located = [*args, *launcher]
    source = source_link(where, tree)
    configure_s = 0.0
    if not (where / "CMakeCache.txt").is_file():
        say(f"configuring the {side} test build in {where}")
        t0 = time.monotonic()
        cmake.configure(host, source=source, build_dir=where, args=located, env=env)
        configure_s = round(time.monotonic() - t0, 3)
    say(f"building {len(targets)} test targets of the {side} tree ({jobs} jobs)")
    t1 = time.monotonic()
    error = ""
    try:
        cmake.build(host, build_dir=where, targets=list(targets), jobs=jobs, env=env)
    except CommandFailed as exc:  # a test that does not compile on one tree is a row, not a crash
        lines = exc.tail.strip().splitlines()
        error = next((x for x in lines if "error" in x or x.startswith("FAILED:")), str(exc))[:300]
    build_s = round(time.monotonic() - t1, 3)
    return TestBuild(side=side, dir=where, tree=tree, key=key, configure_s=configure_s, build_s=build_s,
                     error=error)
