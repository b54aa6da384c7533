"""Build a lane: key, build directory, CMake configure + build, sha256 of what it produced, build.json.

The build key is the sha256 of the canonical JSON of everything that shapes the binaries: the patched
tree digest, the lane, its CMake arguments, the toolchain versions and the digest of worker/'s C++
sources.  Paths (source dirs, the ccache launcher) stay out of the key: they do not change the output.
An unchanged rebuild trusts build.json while every recorded binary keeps its size and mtime
(STYLE 8); ``reverify`` re-hashes them instead.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.canonical import canonical_digest, read_json, sha256_file, write_json
from core.context import Context
from core.errors import ConfigurationError, RuntimeFailure, ToolchainMissing
from core.locks import hold
from core.workspace import WORKER, refuse_links_below
from fetch.tools import Tools
from lanes import base, cmake

SCHEMA_VERSION = 1
RECORD = "build.json"
SOURCE_LINK = "llama-src"
WORKER_TARGET = "dgr-shard-worker"
# What the pipeline runs: libllama, the benchmark, the split/quantize tools, the shard worker, the
# top-k selection probes (worker/tools/: a model's selection margins, ggml_top_k's tie order), the
# probe of the worker's greedy pick, the ring floor, the check of asynchronous reads (the Vulkan
# capture crash), the link floor (a raw connection's crossing, plain and over TLS) and the pass probe (a
# hostile client of authenticated frames).
TOPK_PROBE_TARGET = "dgr-topk-probe"
TOPK_TIES_TARGET = "dgr-topk-ties"
ARGMAX_PROBE_TARGET = "dgr-argmax-probe"
RING_FLOOR_TARGET = "dgr-ring-floor"  # a ring of stage processes with nothing of ours in the way
ASYNC_READS_TARGET = "dgr-async-reads"  # several async tensor reads into host memory, synchronized once
LINK_FLOOR_TARGET = "dgr-link-floor"  # one crossing of a pass port's connection, plain and over TLS
PASS_PROBE_TARGET = "dgr-pass-probe"  # a hostile client of a pass port in authenticated frames
TARGETS: tuple[str, ...] = (
    "llama",
    "llama-bench",
    "llama-gguf-split",
    "llama-quantize",
    WORKER_TARGET,
    TOPK_PROBE_TARGET,
    TOPK_TIES_TARGET,
    ARGMAX_PROBE_TARGET,
    RING_FLOOR_TARGET,
    ASYNC_READS_TARGET,
    LINK_FLOOR_TARGET,
    PASS_PROBE_TARGET,
)
# Files under worker/ that never reach the compiler (Python client side, caches).
_NOT_WORKER_SOURCES = (".py", ".pyc", ".pyi", ".md")  # the Python side and prose: no binary changes
# Folders under worker/ no lane builds: the libFuzzer targets (their own CMake project, `nox -s fuzz`).
_NOT_WORKER_FOLDERS = ("fuzz",)


@dataclass(frozen=True, kw_only=True)
class Build:
    lane: str
    dir: Path
    key: str
    provenance: Mapping[str, Any]
    binaries: Mapping[str, Path]
    worker: Path | None
    reused: bool = False


@dataclass(frozen=True, kw_only=True)
class Tree:
    """The part of a patched tree a build needs (patches.stack.Patched satisfies it)."""

    path: Path
    digest: str
    provenance: Mapping[str, Any]


def worker_digest(worker_dir: Path = WORKER) -> str:
    """sha256 over (relative path, sha256) of worker/'s build inputs: C++, CMake, the proto.

    Not the fuzz targets: a lane never builds them, so a new target or seed rebuilds no lane."""
    entries = []
    for path in sorted(worker_dir.rglob("*")):
        rel = path.relative_to(worker_dir).as_posix()
        parts = rel.split("/")
        if not path.is_file() or "__pycache__" in parts or path.suffix in _NOT_WORKER_SOURCES:
            continue
        if parts[0] in _NOT_WORKER_FOLDERS:
            continue
        entries.append([rel, sha256_file(path)])
    return canonical_digest(entries)


def key_inputs(
    *, tree_digest: str, lane: str, cmake_args: list[str], versions: Mapping[str, str], worker: str
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tree": tree_digest,
        "lane": lane,
        "cmake_args": list(cmake_args),
        "toolchain": dict(sorted(versions.items())),
        "worker": worker,
    }


def build_key(inputs: Mapping[str, Any]) -> str:
    return canonical_digest(dict(inputs))


def build_dir(ctx: Context, lane: str, key: str) -> Path:
    return ctx.workspace.builds / f"{lane}-{key[:16]}"


def _commit(tree: Tree) -> str:
    prov = tree.provenance
    commit = (prov.get("pristine") or {}).get("commit") or prov.get("commit")
    if not commit:
        raise ConfigurationError(
            f"the patched tree at {tree.path} has no commit in its provenance", hint="run `dgr patch` again"
        )
    return str(commit)


def ensure_build(
    ctx: Context,
    lane_name: str,
    *,
    options: base.BuildOptions | None = None,
    project: Path = WORKER,
    targets: tuple[str, ...] = TARGETS,
) -> Build:
    """The lane's build of the current patched tree and worker; a no-op when nothing changed.

    Raises ToolchainMissing (exit 4) before touching anything when the lane cannot build here.
    """
    lane = base.get(lane_name)
    options = options or base.BuildOptions.from_env(ctx.env)
    lane.cmake_args(options)  # a bad option is a usage error before any download, fetch or patch work
    probe = lane.probe(ctx.env)
    provision = getattr(lane, "provision", None)
    if not probe.usable and provision is not None:
        # The lane installs what it pins itself (a cuBLAS wheel, Vulkan headers) into the workspace.
        probe = provision(ctx.workspace, ctx.env, probe)
    probe.require()
    if not (project / "CMakeLists.txt").is_file():
        raise ConfigurationError(f"{project}/CMakeLists.txt is missing: nothing to build")
    from patches.stack import ensure_patched  # the patch stage's own no-op check is fast

    patched = ensure_patched(ctx, reverify=options.reverify)
    tree = Tree(path=patched.path, digest=patched.digest, provenance=patched.provenance)
    return build_tree(ctx, lane, probe, tree, options=options, project=project, targets=targets)


def build_tree(
    ctx: Context,
    lane: base.Lane,
    probe: base.ToolchainProbe,
    tree: Tree,
    *,
    options: base.BuildOptions,
    project: Path,
    targets: tuple[str, ...],
) -> Build:
    host = cmake.probe_host(ctx.env)
    if host.problem:
        raise ToolchainMissing(f"{lane.name} lane: {host.problem}")
    args, inputs = _keyed(lane, probe, host, tree, options=options, project=project)
    key = build_key(inputs)
    where = build_dir(ctx, lane.name, key)
    all_targets = tuple(dict.fromkeys((*targets, *lane.targets)))
    reused = _reuse(where, key, reverify=options.reverify)
    if reused is not None:
        return reused
    refuse_links_below(ctx.workspace.root, where)
    ctx.workspace.ensure(where)
    with _locked(where):
        started = time.monotonic()
        (where / RECORD).unlink(missing_ok=True)  # a half-finished dir must never be trusted
        env = build_environment(ctx, lane, probe, tree)
        located = _located_args(lane, probe, host, args, source=source_link(where, tree.path))
        seconds = _configure_and_build(
            host,
            project=project,
            where=where,
            located=located,
            targets=all_targets,
            jobs=options.parallel,
            env=env,
        )
        binaries = _collect(where, all_targets)
        prov = _provenance(
            lane,
            probe,
            host,
            tree,
            key=key,
            inputs=inputs,
            project=project,
            located=located,
            targets=all_targets,
            jobs=options.parallel,
            seconds=seconds,
            started=started,
            binaries=binaries,
        )
        write_json(where / RECORD, prov)
    return _as_build(where, prov, reused=False)


def _keyed(
    lane: base.Lane,
    probe: base.ToolchainProbe,
    host: cmake.HostTools,
    tree: Tree,
    *,
    options: base.BuildOptions,
    project: Path,
) -> tuple[list[str], dict[str, Any]]:
    """The lane's CMake arguments and the build key's inputs: what, changed, makes another build."""
    args = [
        *lane.cmake_args(options, probe),
        *cmake.identity_args(lane=lane.name, commit=_commit(tree)),
    ]
    inputs = key_inputs(
        tree_digest=tree.digest,
        lane=lane.name,
        cmake_args=args,
        versions={**host.versions, **probe.versions},
        worker=worker_digest(project),
    )
    return args, inputs


def _located_args(
    lane: base.Lane, probe: base.ToolchainProbe, host: cmake.HostTools, args: list[str], *, source: Path
) -> list[str]:
    """The keyed arguments plus where things are (the tree through its link, the lane's toolchain
    paths): provenance, not key, so a moved toolchain does not rebuild."""
    located = [*args, *cmake.location_args(host, llama_source=source)]
    lane_locations = getattr(lane, "location_args", None)
    if lane_locations is not None:
        located += lane_locations(probe, host)
    return located


def _configure_and_build(
    host: cmake.HostTools,
    *,
    project: Path,
    where: Path,
    located: list[str],
    targets: tuple[str, ...],
    jobs: int,
    env: Mapping[str, str],
) -> dict[str, float]:
    """CMake configure, then build the targets; returns each step's seconds for the record."""
    t0 = time.monotonic()
    cmake.configure(
        host,
        source=project,
        build_dir=where,
        args=located,
        env=env,
    )
    t1 = time.monotonic()
    cmake.build(host, build_dir=where, targets=targets, jobs=jobs, env=env)
    t2 = time.monotonic()
    return {"configure": round(t1 - t0, 3), "build": round(t2 - t1, 3)}


def _provenance(
    lane: base.Lane,
    probe: base.ToolchainProbe,
    host: cmake.HostTools,
    tree: Tree,
    *,
    key: str,
    inputs: Mapping[str, Any],
    project: Path,
    located: list[str],
    targets: tuple[str, ...],
    jobs: int,
    seconds: Mapping[str, float],
    started: float,
    binaries: Mapping[str, Any],
) -> dict[str, Any]:
    """build.json: the key and what went into it, the tree, toolchain and host tools, the arguments
    and targets, timings, and each binary's identity (what a later run trusts, STYLE 8)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "dgr.build",
        "lane": lane.name,
        "key": key,
        "key_inputs": inputs,
        "patched_tree": {
            "path": str(tree.path),
            "digest": tree.digest,
            "provenance": dict(tree.provenance),
        },
        "toolchain": probe.as_dict(),
        "host_tools": {
            "cmake": host.cmake,
            "generator": host.generator,
            "generator_version": host.generator_version,
            "cxx": host.cxx,
            "cc": host.cc,
            "ccache": host.ccache,
            "versions": dict(host.versions),
        },
        "cmake_source": str(project),
        "cmake_args": located,
        "targets": list(targets),
        "jobs": jobs,
        "machine": {"system": platform.system(), "arch": platform.machine()},
        "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": {**seconds, "total": round(time.monotonic() - started, 3)},
        "binaries": binaries,
    }


def source_link(where: Path, tree: Path) -> Path:
    """``<build dir>/llama-src`` -> the patched tree, the path CMake and the compilers see.

    The patched tree's own path names its patch stack, so a changed patch would give every
    compile line a new path and ccache would miss on all ~250 files, not just the patched ones.
    Seen through this link (relative under CCACHE_BASEDIR), unchanged files hit in any build dir.
    """
    link = where / SOURCE_LINK
    if link.is_symlink() and os.readlink(link) == str(tree):
        return link
    tmp = where / f".{SOURCE_LINK}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(tree, tmp)
    os.replace(tmp, link)
    return link


def build_environment(
    ctx: Context, lane: base.Lane, probe: base.ToolchainProbe, tree: Tree
) -> dict[str, str]:
    env = dict(ctx.env)
    env.update(lane.environment(ctx.env, probe))
    # ggml's CMakeLists asks `git rev-parse HEAD` inside the tree and compiles the answer into
    # ggml-base; the patched tree has no .git, so git would climb to whatever repository holds the
    # workspace (this project's own checkout) and every commit here would change the binaries.
    ceiling = str(tree.path.parent)
    env["GIT_CEILING_DIRECTORIES"] = os.pathsep.join(
        filter(None, [ceiling, env.get("GIT_CEILING_DIRECTORIES")])
    )
    # Paths under the workspace hash as relative ones, so build dirs of different keys (siblings at
    # the same depth) share ccache hits.
    env.setdefault("CCACHE_BASEDIR", str(ctx.workspace.root))
    return env


def _collect(where: Path, targets: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """size, mtime_ns and sha256 of each executable target and every library the build produced."""
    found: dict[str, Path] = {}
    for target in targets:
        candidates = [where / "bin" / target, *sorted(where.rglob(target))]
        candidates = [c for c in candidates if c.relative_to(where).parts[:1] != (SOURCE_LINK,)]
        exe = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
        if exe is not None:
            found[target] = exe
    for lib in sorted(where.rglob("lib*")):
        if (
            lib.is_file()
            and "CMakeFiles" not in lib.parts
            and (lib.suffix == ".a" or ".so" in lib.name or lib.suffix == ".dylib")
        ):
            found.setdefault(lib.name, lib)
    missing = [
        t for t in targets if t not in found and f"lib{t}.a" not in found and not _has_shared(found, t)
    ]
    if missing:
        raise RuntimeFailure(f"the build finished but produced no {', '.join(missing)} in {where}")
    return {name: _identity(path, where) for name, path in sorted(found.items())}


def _has_shared(found: Mapping[str, Path], target: str) -> bool:
    return any(n.startswith(f"lib{target}.so") or n == f"lib{target}.dylib" for n in found)


def _identity(path: Path, where: Path) -> dict[str, Any]:
    st = path.stat()
    return {
        "path": path.relative_to(where).as_posix(),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": sha256_file(path),
    }


def _reuse(where: Path, key: str, *, reverify: bool) -> Build | None:
    """The recorded build when its key matches and every binary is still the one recorded.

    A binary that changed is removed so the build tool relinks it (its mtime would look newer).
    """
    try:
        prov = read_json(where / RECORD)
        ok = prov.get("schema_version") == SCHEMA_VERSION and prov.get("key") == key
    except (OSError, ValueError, AttributeError):
        return None
    if not ok:
        return None
    changed = []
    for rec in prov["binaries"].values():
        path = where / rec["path"]
        try:
            st = path.stat()
        except FileNotFoundError:
            changed.append(path)
            continue
        same = st.st_size == rec["size"] and (st.st_mtime_ns == rec["mtime_ns"] or reverify)
        if not same or (reverify and sha256_file(path) != rec["sha256"]):
            changed.append(path)
    if changed:
        for path in changed:
            path.unlink(missing_ok=True)
        return None
    return _as_build(where, prov, reused=True)


def _as_build(where: Path, prov: Mapping[str, Any], *, reused: bool) -> Build:
    binaries = {name: where / rec["path"] for name, rec in prov["binaries"].items()}
    return Build(
        lane=prov["lane"],
        dir=where,
        key=prov["key"],
        provenance=prov,
        binaries=binaries,
        worker=binaries.get(WORKER_TARGET),
        reused=reused,
    )


def _locked(where: Path) -> AbstractContextManager[Path]:
    """One build per directory at a time; the second fails fast naming the holder."""
    return hold(where.parent / f"{where.name}.lock", what=f"the build directory {where}", wait_s=0)


def fetch_tools(ctx: Context) -> Tools:
    """The programs provisioning and sealing run (the split tool, the top-k probe, the fixture generator),
    from the CPU lane's build, built on first use and a no-op when current. fetch cannot import lanes;
    callers pass this."""
    cpu = functools.cache(lambda: ensure_build(ctx, "cpu"))  # checked once, however many sets or variants

    def fixture(arch: str, n_layer: int, seed: int) -> Mapping[str, Path]:
        from lanes import arch_fixtures
        from patches.stack import ensure_patched

        build = cpu()
        where = ctx.workspace.ensure(arch_fixtures.folder(ctx.workspace.root, build.key, n_layer))
        return arch_fixtures.models(where, ensure_patched(ctx).path, build.dir, arch, n_layer, seed=seed)

    return Tools(
        split=lambda: cpu().binaries["llama-gguf-split"], probe_build=lambda: cpu().dir, fixture=fixture
    )
