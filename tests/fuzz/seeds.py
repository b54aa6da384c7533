"""Inputs per target, for the property tests to mutate and the fuzzer to start from: the valid ones,
then the hostile shapes that were tracebacks once (issue 42: a lone surrogate as a JSON escape, a
whole-number float where a schema says integer, a series that is not UTF-8), each of which a target
must refuse with a DgrError."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from core.workspace import PROJECT_ROOT
from tests.fuzz.targets import ARCHIVE_PREFIX

MANIFESTS = PROJECT_ROOT / "manifests"
SERIES = PROJECT_ROOT / "patches" / "series"


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (
            (f"{ARCHIVE_PREFIX}/CMakeLists.txt", b"project(x)\n"),
            (f"{ARCHIVE_PREFIX}/src/a.c", b"int a;\n"),
            ("other/file", b"x"),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _gguf() -> bytes:
    from tests.unit import ggufmaker

    return ggufmaker.split_set(2, [8, 4], blocks=2)[0]


def _edited(path: Path, *edits: tuple[bytes, bytes]) -> list[bytes]:
    """One copy of ``path``'s bytes per edit (old -> new, first occurrence, which must be there)."""
    data = path.read_bytes()
    out = []
    for old, new in edits:
        assert old in data, (path, old)
        out.append(data.replace(old, new, 1))
    return out


def hostile(target: str) -> list[bytes]:
    """The shapes each target must refuse with a DgrError (an empty list for the others)."""
    if target in ("json", "recipe"):
        return _edited(
            MANIFESTS / "recipes" / "tiny-llama.json",
            (b'"description": "', b'"description": "\\udc80'),
            (b'"mono": {', b'"mono\\ud800": {'),
            *([(b'"n_decode": 32', b'"n_decode": 32.0')] if target == "recipe" else []),
        )
    if target == "artifact_set":
        return _edited(
            MANIFESTS / "artifacts" / "tiny-llama.json",
            (b'"description": "', b'"description": "\\udc80'),
            (b'"chunk_size": 4194304', b'"chunk_size": 4194304.0'),
            (b'"size": 46085280', b'"size": 46085280.0'),
        )
    if target == "series":
        return _edited(
            SERIES, (b"# dgr patch stack", b"# dgr \xff stack"), (b"-range-", b"-range\xed\xb2\x80-")
        )
    return []


def seeds(target: str) -> list[bytes]:
    return _valid(target) + hostile(target)


def _valid(target: str) -> list[bytes]:
    if target == "gguf_header":
        return [_gguf()]
    if target == "archive":
        return [_tar()]
    if target == "patch":
        patches = sorted((PROJECT_ROOT / "patches").glob("*.patch"), key=lambda p: p.stat().st_size)
        return [p.read_bytes() for p in patches[:2]]  # the two smallest: the same headers, faster runs
    if target in ("json", "recipe"):
        return [(MANIFESTS / "recipes" / "tiny-llama.json").read_bytes()]
    if target == "artifact_set":
        return [(MANIFESTS / "artifacts" / "tiny-llama.json").read_bytes()]
    if target == "series":
        return [SERIES.read_bytes()]
    raise KeyError(target)
