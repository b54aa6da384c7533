"""CPU lane builds with the real cmake, compiler and build tool.

The first tests drive a tiny stand-in project (seconds): key, build.json, hashes, no-op, a failing
build.  The slow one builds the real patched tree and the shard worker in the real workspace (what
`nox -s build-cpu` does) and checks that a second run is a no-op.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from core.canonical import read_json, sha256_file
from core.context import Context
from core.errors import CommandFailed
from lanes import build, cpu
from lanes.base import BuildOptions

COMMIT = "4df29be4f4c3673f428170fda944a5b19f743bb8"

STANDIN = """\
cmake_minimum_required(VERSION 3.19)
project(standin C)
set(DGR_LLAMA_SOURCE_DIR "" CACHE PATH "")
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(llama STATIC ${DGR_LLAMA_SOURCE_DIR}/llama.c)
# What ggml does at configure time: ask git for the commit of the tree it is built from.
execute_process(COMMAND git rev-parse HEAD WORKING_DIRECTORY ${DGR_LLAMA_SOURCE_DIR}
                OUTPUT_VARIABLE tree_commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
file(WRITE ${CMAKE_BINARY_DIR}/tree-commit.txt "${tree_commit}")
foreach(t @EXECUTABLES@)
  add_executable(${t} main.c)
  target_link_libraries(${t} llama)
endforeach()
""".replace("@EXECUTABLES@", " ".join(t for t in build.TARGETS if t != "llama"))  # every target a lane builds


@pytest.fixture
def standin(tmp_path: Path) -> tuple[Path, build.Tree]:
    """A project with the pipeline's targets, built against a 'patched tree' of one C file."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(STANDIN)
    (project / "main.c").write_text("int llama(void);\nint main(void) { return llama(); }\n")
    llama = tmp_path / "patched"
    llama.mkdir()
    (llama / "llama.c").write_text("int llama(void) { return 0; }\n")
    tree = build.Tree(path=llama, digest="1" * 40, provenance={"pristine": {"commit": COMMIT}})
    return project, tree


def build_standin(ctx: Context, project: Path, tree: build.Tree) -> build.Build:
    probe = cpu.probe(ctx.env).require()
    return build.build_tree(
        ctx, cpu, probe, tree, options=BuildOptions(jobs=2), project=project, targets=build.TARGETS
    )


def test_build_records_what_it_produced_and_a_rerun_is_a_noop(
    ctx: Context, standin: tuple[Path, build.Tree]
) -> None:
    project, tree = standin
    first = build_standin(ctx, project, tree)
    assert not first.reused
    assert first.dir == ctx.workspace.builds / f"cpu-{first.key[:16]}"
    record = read_json(first.dir / build.RECORD)
    assert record["key"] == first.key == build.build_key(record["key_inputs"])
    assert record["key_inputs"]["tree"] == tree.digest and record["key_inputs"]["lane"] == "cpu"
    assert "-DGGML_NATIVE=OFF" in record["key_inputs"]["cmake_args"]
    assert f"-DDGR_LLAMA_COMMIT={COMMIT}" in record["key_inputs"]["cmake_args"]
    assert not any("DGR_LLAMA_SOURCE_DIR" in a for a in record["key_inputs"]["cmake_args"])
    link = first.dir / build.SOURCE_LINK
    assert f"-DDGR_LLAMA_SOURCE_DIR={link}" in record["cmake_args"] and link.resolve() == tree.path
    # Compile lines name the tree through the link, so they are the same in every build dir.
    assert f"{link}/llama.c" in (first.dir / "build.ninja").read_text()
    assert set(record["binaries"]) >= {
        "llama-bench",
        "llama-gguf-split",
        "llama-quantize",
        "dgr-shard-worker",
        "libllama.a",
    }
    for name, rec in record["binaries"].items():
        assert sha256_file(first.dir / rec["path"]) == rec["sha256"], name
    assert first.worker == first.dir / "bin" / "dgr-shard-worker"
    assert subprocess.run([str(first.worker)], check=False).returncode == 0

    recorded = (first.dir / build.RECORD).stat().st_mtime_ns
    started = time.monotonic()
    again = build_standin(ctx, project, tree)
    print(f"\nstand-in no-op rebuild: {time.monotonic() - started:.2f} s")
    # A no-op by what it did, not by how long it took (a loaded box is slow): nothing configured,
    # built or recorded again.
    assert again.reused and again.key == first.key
    assert (first.dir / build.RECORD).stat().st_mtime_ns == recorded


def test_changed_worker_sources_or_tree_get_their_own_build(
    ctx: Context, standin: tuple[Path, build.Tree]
) -> None:
    project, tree = standin
    first = build_standin(ctx, project, tree)
    (project / "main.c").write_text("int llama(void);\nint main(void) { return 1 + llama(); }\n")
    second = build_standin(ctx, project, tree)
    assert second.key != first.key and second.dir != first.dir and not second.reused
    assert subprocess.run([str(second.worker)], check=False).returncode == 1
    assert (first.dir / build.RECORD).is_file()  # the earlier good build is left alone
    other = build.Tree(path=tree.path, digest="2" * 40, provenance=tree.provenance)
    assert build_standin(ctx, project, other).key not in (first.key, second.key)


def test_git_never_sees_the_repository_around_the_workspace(
    ctx: Context, standin: tuple[Path, build.Tree], tmp_path: Path
) -> None:
    """ggml compiles `git rev-parse HEAD` of its tree into ggml-base: an enclosing checkout must not leak."""
    project, tree = standin
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    ident = ["-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(
        ["git", *ident, "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "outer"],
        check=True,
        env=env,
    )
    assert (
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree.path, env=env, capture_output=True).returncode
        == 0
    )
    done = build_standin(ctx, project, tree)
    assert (done.dir / "tree-commit.txt").read_text() == ""


def test_a_new_patched_tree_path_still_hits_ccache(
    ctx: Context, standin: tuple[Path, build.Tree], tmp_path: Path
) -> None:
    """Patched trees live at paths named by their stack; unchanged files must still come from ccache."""
    if shutil.which("ccache", path=ctx.env.get("PATH")) is None:
        pytest.skip("ccache is not installed")
    project, tree = standin
    env = {**ctx.env, "CCACHE_DIR": str(tmp_path / "ccache")}
    ctx = Context(env=env, workspace=ctx.workspace)

    def stats() -> tuple[int, int]:
        out = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True).stdout
        got = {k: int(v) for k, v in (line.split("\t") for line in out.splitlines() if "\t" in line)}
        return got["direct_cache_hit"] + got["preprocessed_cache_hit"], got["cache_miss"]

    build_standin(ctx, project, tree)
    moved = tmp_path / "patched-elsewhere"
    shutil.copytree(tree.path, moved)
    hits, misses = stats()
    build_standin(ctx, project, build.Tree(path=moved, digest="3" * 40, provenance=tree.provenance))
    now_hits, now_misses = stats()
    assert now_misses == misses and now_hits - hits >= 2  # llama.c and main.c, both unchanged


def test_a_failing_build_raises_and_leaves_no_record(ctx: Context, standin: tuple[Path, build.Tree]) -> None:
    project, tree = standin
    (tree.path / "llama.c").write_text("int llama(void) { return syntax error; }\n")
    with pytest.raises(CommandFailed) as err:
        build_standin(ctx, project, tree)
    assert err.value.exit_code == 6
    assert not list(ctx.workspace.builds.glob(f"*/{build.RECORD}"))


@pytest.mark.slow
@pytest.mark.timeout(7200)  # a cold build of the real tree takes tens of minutes on two cores
def test_real_cpu_build_of_the_patched_tree_and_worker_then_noop(real_ctx: Context) -> None:
    first = build.ensure_build(real_ctx, "cpu")
    record = read_json(first.dir / build.RECORD)
    for name in ("llama-bench", "llama-gguf-split", "llama-quantize", "dgr-shard-worker", "libllama.a"):
        rec = record["binaries"][name]
        assert sha256_file(first.dir / rec["path"]) == rec["sha256"], name
    assert first.worker is not None and first.worker.is_file()
    from patches.stack import ensure_patched

    assert record["key_inputs"]["tree"] == ensure_patched(real_ctx).digest
    assert record["key_inputs"]["worker"] == build.worker_digest()
    bench = subprocess.run([str(first.binaries["llama-bench"]), "--help"], capture_output=True, timeout=60)
    assert bench.returncode == 0

    recorded = (first.dir / build.RECORD).stat().st_mtime_ns
    started = time.monotonic()
    again = build.ensure_build(real_ctx, "cpu")
    seconds = time.monotonic() - started
    print(f"\nCPU lane no-op rebuild: {seconds:.2f} s ({again.dir})")
    assert again.reused and again.key == first.key  # by what it did, not how long (see the stand-in)
    assert (first.dir / build.RECORD).stat().st_mtime_ns == recorded
