"""The worker's libFuzzer targets (worker/fuzz): built here with clang, their seeds real passes.

A target is a program libFuzzer links itself into; `nox -s fuzz` runs it as it runs the atheris ones
(tests/fuzz/run.py).  The seeds are passes a streamed ring's stages read on their pass ports, recorded
by the workers' ``--record-passes`` (tests/integration/test_fuzz_corpus.py, which also refreshes them:
``DGR_FUZZ_CORPUS_OUT=tests/fuzz/corpus/passes``): as a ForwardRequest's bytes for forward_request,
framed as on the wire for pass_port (each alone, and all of them on one connection).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from core.errors import ToolchainMissing
from core.workspace import PROJECT_ROOT
from lanes import cmake, packages

SOURCE = PROJECT_ROOT / "worker" / "fuzz"
PASSES = Path(__file__).parent / "corpus" / "passes"
PROGRAMS = {"forward_request": "dgr-fuzz-forward-request", "pass_port": "dgr-fuzz-pass-port"}


def build(where: Path) -> dict[str, Path]:
    """Configure and build every target under ``where`` with the lanes' own CMake steps (clang and its
    runtimes installed first where they are missing, as `nox -s deps` installs a lane's); the programs
    by target name.  Raises ToolchainMissing (exit 4) or CommandFailed (its tail) as a lane build does."""
    code = packages.ensure(["cpu", "fuzz"], os.environ)
    if code:
        raise ToolchainMissing(f"clang or its runtimes are missing (lanes.packages exited {code})")
    host = cmake.probe_host(os.environ)
    if host.problem:
        raise ToolchainMissing(f"the worker's fuzz targets: {host.problem}")
    clang = [cmake.define("CMAKE_CXX_COMPILER", "clang++")]
    cmake.configure(host, source=SOURCE, build_dir=where, args=clang, env=os.environ)
    programs = list(PROGRAMS.values())
    cmake.build(host, build_dir=where, targets=programs, jobs=os.cpu_count() or 1, env=os.environ)
    return {name: where / program for name, program in PROGRAMS.items()}


def frame(body: bytes) -> bytes:
    """A pass as the pass port reads it: its length, 4 bytes little-endian, then the message."""
    return struct.pack("<I", len(body)) + body


def seeds(name: str) -> list[bytes]:
    passes = [p.read_bytes() for p in sorted(PASSES.glob("*.bin"))]
    if name == "forward_request":
        return passes
    if name == "pass_port":
        return [frame(p) for p in passes] + [b"".join(frame(p) for p in passes)]
    raise KeyError(f"unknown worker fuzz target {name!r}: choose from {', '.join(PROGRAMS)}")
