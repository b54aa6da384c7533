"""The worker's libFuzzer targets (worker/fuzz): built here with clang, their seeds real passes.

A target is a program libFuzzer links itself into; `nox -s fuzz` runs it as it runs the atheris ones
(tests/fuzz/run.py).  The seeds are passes a streamed ring's stages read on their pass ports, recorded
by the workers' ``--record-passes`` (tests/integration/test_fuzz_corpus.py, which also refreshes them:
``DGR_FUZZ_CORPUS_OUT=tests/fuzz/corpus/passes``): as a ForwardRequest's bytes for forward_request,
framed as on the wire for pass_port (each alone, and all of them on one connection), and framed and
tagged as authenticated frames for mac_frames (worker/src/mac_frames.h: the same chunks, nonces and
ChaCha20-Poly1305 tags, made here by the ``cryptography`` package under the target's fixed key).
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
PROGRAMS = {
    "forward_request": "dgr-fuzz-forward-request",
    "pass_port": "dgr-fuzz-pass-port",
    "mac_frames": "dgr-fuzz-mac-frames",
}
MAC_KEY = bytes(range(1, 33))  # worker/fuzz/mac_frames_fuzz.cpp's kSendKey
MAC_CHUNK = 24576  # MacFrames::kChunkBytes


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


def mac_frames(bodies: list[bytes]) -> bytes:
    """``bodies`` as one connection's authenticated frames: each frame's head and body, its body in
    chunks of MAC_CHUNK (one, empty, for an empty body), then one tag per chunk, the chunks numbered
    from 0 across the connection; a tag is ChaCha20-Poly1305 over nothing, with the chunk (the head
    before the first) as additional data and its number, big-endian after 4 zero bytes, as nonce."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    aead, out, number = ChaCha20Poly1305(MAC_KEY), [], 0
    for body in bodies:
        head = struct.pack("<I", len(body))
        chunks = [body[at : at + MAC_CHUNK] for at in range(0, len(body), MAC_CHUNK)] or [b""]
        tags = []
        for k, chunk in enumerate(chunks):
            nonce = bytes(4) + number.to_bytes(8, "big")
            tags.append(aead.encrypt(nonce, b"", (head if k == 0 else b"") + chunk))
            number += 1
        out.append(head + body + b"".join(tags))
    return b"".join(out)


def seeds(name: str) -> list[bytes]:
    passes = [p.read_bytes() for p in sorted(PASSES.glob("*.bin"))]
    if name == "forward_request":
        return passes
    if name == "pass_port":
        return [frame(p) for p in passes] + [b"".join(frame(p) for p in passes)]
    if name == "mac_frames":
        return [mac_frames([p]) for p in passes] + [mac_frames(passes)]
    raise KeyError(f"unknown worker fuzz target {name!r}: choose from {', '.join(PROGRAMS)}")
