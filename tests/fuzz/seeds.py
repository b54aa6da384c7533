"""Valid inputs per target, for the property tests to mutate and the fuzzer to start from."""

from __future__ import annotations

import io
import tarfile

from core.workspace import PROJECT_ROOT
from tests.fuzz.targets import ARCHIVE_PREFIX

MANIFESTS = PROJECT_ROOT / "manifests"


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


def seeds(target: str) -> list[bytes]:
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
    raise KeyError(target)
