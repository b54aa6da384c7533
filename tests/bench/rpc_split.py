"""llama.cpp's own way of splitting a model across processes, for the benchmark's side by side: the
pinned tree's ``ggml-rpc-server`` and an RPC-enabled ``llama-bench``.

Built here rather than by a lane: nothing ships it, only ``nox -s bench`` needs it.  The pristine
(unpatched) tree at the pin, the CPU lane's own CMake switches plus ``GGML_RPC=ON``, through ccache,
into ``<workspace>/builds/bench-rpc-<tree>``; a rebuild is a no-op once both programs are there.

Both sides hold their weights alike: read into the process's own memory on transparent huge pages.
Our worker does that by default on the CPU lane (worker/README.md, "Weights in memory"); llama-bench
here runs with ``-mmp 0``, and since the pristine tree lacks patch 0005 its processes ask glibc's
malloc for huge pages instead (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: the same madvise on every
large allocation), so the side by side compares the splits, not the page sizes.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core import proc
from core.context import Context
from fetch.source import ensure_pristine
from lanes import cmake
from lanes.base import BuildOptions
from worker.launcher import Placed

TARGETS = ("ggml-rpc-server", "llama-bench")


@dataclass(frozen=True)
class RpcTools:
    server: Path
    bench: Path


def build(ctx: Context) -> RpcTools:
    """The two programs, built once per pinned tree (minutes cold, seconds with a warm ccache)."""
    tree = ensure_pristine(ctx)
    where = ctx.workspace.builds / f"bench-rpc-{tree.tree[:16]}"
    tools = RpcTools(server=where / "bin" / TARGETS[0], bench=where / "bin" / TARGETS[1])
    if tools.server.is_file() and tools.bench.is_file():
        return tools
    host = cmake.probe_host(ctx.env)
    assert host.problem is None, host.problem
    commit = str(tree.provenance.get("commit", ""))
    args = [
        *cmake.common_args(BuildOptions.from_env(ctx.env)),
        cmake.define("GGML_RPC", "ON"),
        # build-info would otherwise ask git, and find the repository around the workspace
        cmake.define("LLAMA_BUILD_COMMIT", commit[:8]),
        cmake.define("LLAMA_BUILD_NUMBER", "0"),
    ]
    if host.ccache:
        args += [
            cmake.define("CMAKE_C_COMPILER_LAUNCHER", host.ccache),
            cmake.define("CMAKE_CXX_COMPILER_LAUNCHER", host.ccache),
        ]
    ctx.workspace.ensure(where)
    cmake.configure(host, source=tree.path, build_dir=where, args=args, env=ctx.env)
    cmake.build(host, build_dir=where, targets=TARGETS, jobs=2, env=ctx.env)
    return tools


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(host: str, port: int, server: subprocess.Popen, deadline_s: float = 60.0) -> None:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        if server.poll() is not None:
            raise RuntimeError(f"ggml-rpc-server on {host}:{port} exited with {server.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"ggml-rpc-server on {host}:{port} did not listen within {deadline_s:.0f} s")


def _on_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with glibc's malloc advising its large allocations for transparent huge pages."""
    tunables = [
        t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb=")
    ]
    return {**env, "GLIBC_TUNABLES": ":".join([*tunables, "glibc.malloc.hugetlb=1"])}


def _held(argv: list[str], cpus: str | None) -> list[str]:
    """``argv`` under ``taskset -c CPUS`` (every thread held to those CPUs, as our worker's --cpus)."""
    return ["taskset", "-c", cpus, *argv] if cpus else argv


SERVER_PORT = 50052  # in a namespace of its own every port is free


@contextmanager
def servers(
    binary: Path,
    n: int,
    *,
    threads: int,
    env: Mapping[str, str],
    log: Path,
    cpus: str | None = None,
    places: Sequence[Placed] = (),
) -> Iterator[list[str]]:
    """``n`` RPC servers, one CPU thread each by default, held to ``cpus`` if given, on 127.0.0.1 or at
    ``places`` (one each, as a worker is placed: a shaped fabric's namespaces, Fabric.places); their
    addresses, stopped on exit."""
    procs: list[subprocess.Popen] = []
    addresses: list[str] = []
    with contextlib.ExitStack() as logs:
        logs.callback(_stop, procs)  # first in, last out: every server started is stopped, whatever fails
        for k in range(n):
            place = places[k] if places else Placed()
            host, port = place.host or "127.0.0.1", SERVER_PORT if places else _free_port()
            out = logs.enter_context((log.parent / f"{log.name}-{k}.log").open("wb"))
            argv = _held([str(binary), "-H", host, "-p", str(port), "-t", str(threads)], cpus)
            procs.append(
                subprocess.Popen(
                    [*place.prefix, *argv], stdout=out, stderr=subprocess.STDOUT, env=_on_huge_pages(env)
                )
            )
            _wait_listening(host, port, procs[-1])
            addresses.append(f"{host}:{port}")
        yield addresses


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def tg(
    bench: Path,
    model: Path,
    *,
    n_gen: int,
    repetitions: int,
    threads: int,
    env: Mapping[str, str],
    rpc: Sequence[str] = (),
    gpu_layers: int = 0,
    cpus: str | None = None,
    prefix: Sequence[str] = (),
) -> list[float]:
    """llama-bench's tg tok/s samples: the whole model here, or ``gpu_layers`` of its layers on the RPC
    servers (split between them by their free memory: equally on one host); held to ``cpus`` if given,
    run under ``prefix`` (``ip netns exec NS``: a shaped fabric's stage 0) if given."""
    argv = [
        str(bench),
        "-m",
        str(model),
        "-p",
        "0",
        "-n",
        str(n_gen),
        "-t",
        str(threads),
        "-r",
        str(repetitions),
        "-mmp",
        "0",
        "-o",
        "json",
    ]
    if rpc:
        argv += ["--rpc", ",".join(rpc), "-ngl", str(gpu_layers)]
    else:
        argv += ["-ngl", "0"]
    out = proc.run([*prefix, *_held(argv, cpus)], env=_on_huge_pages(env), no_output_timeout=600).output
    rows = json.loads(out[out.index("[") : out.rindex("]") + 1])
    row = next((r for r in rows if r.get("n_prompt") == 0 and r.get("n_gen") == n_gen), None)
    assert row is not None, f"llama-bench printed no tg{n_gen} row: {out[-500:]}"
    return [float(v) for v in row["samples_ts"]]
