"""Inputs per target, for the property tests to mutate and the fuzzer to start from: the valid ones,
then the hostile shapes that were tracebacks once (issue 42: a lone surrogate as a JSON escape, a
whole-number float where a schema says integer, a series that is not UTF-8), each of which a target
must refuse with a DgrError."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

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


def hub_tree() -> list[dict[str, Any]]:
    """A page of the hub's tree listing as the hub writes it: a folder, an LFS file, a file in git."""
    return [
        {"type": "directory", "path": "Q4", "oid": "1" * 40, "size": 0},
        {
            "type": "file",
            "path": "Q4/a.gguf",
            "size": 1000,
            "oid": "2" * 40,
            "lfs": {"oid": "ab" * 32, "size": 1000, "pointerSize": 134},
        },
        {"type": "file", "path": "README.md", "size": 10, "oid": "3" * 40},
    ]


def _tree_with(**changes: Any) -> bytes:
    """The tree with its LFS file's fields changed (``None`` removes one); ``1e400`` is spelled raw,
    since json.dumps cannot write a number that overflows a float."""
    tree = hub_tree()
    for key, value in changes.items():
        if value is None:
            del tree[1][key]
        else:
            tree[1][key] = value
    return json.dumps(tree).replace('"<1e400>"', "1e400").encode()


def _tree_plus(*extra: dict[str, Any]) -> bytes:
    return json.dumps([*hub_tree(), *extra]).encode()


_FILE = {"type": "file", "size": 5, "oid": "4" * 40}
_DEEP = b"[" * 100_000 + b"]" * 100_000
# name -> (which answer, its bytes, a word the refusal names): the shapes round three found
HOSTILE_HUB_ANSWERS: dict[str, tuple[str, bytes, str]] = {
    "size-text": ("tree", _tree_with(size="abc"), "size"),
    "size-list": ("tree", _tree_with(size=[1]), "size"),
    "size-overflow": ("tree", _tree_with(size="<1e400>"), "out of range"),
    "size-negative": ("tree", _tree_with(size=-5), "size"),
    "size-float": ("tree", _tree_with(size=1000.0), "integer"),
    "size-bool": ("tree", _tree_with(size=True), "size"),
    "size-missing": ("tree", _tree_with(size=None), "size"),
    "sizes-disagree": ("tree", _tree_with(lfs={"oid": "ab" * 32, "size": 999}), "two sizes"),
    "path-not-text": ("tree", _tree_with(path=7), "path"),
    "file-and-folder": ("tree", _tree_plus({**_FILE, "path": "Q4/a.gguf/x.gguf"}), "a folder"),
    "listed-twice": ("tree", _tree_plus({**_FILE, "path": "Q4/a.gguf"}), "twice"),
    "tree-not-a-list": ("tree", b'{"error": "nope"}', "array"),
    "tree-deep": ("tree", _DEEP, "nested"),
    "tree-not-json": ("tree", b"<html>busy</html>", "not valid JSON"),
    "revision-deep": ("revision", _DEEP, "nested"),
    "revision-no-sha": ("revision", b'{"id": "org/x"}', "sha"),
    "revision-sha-number": ("revision", b'{"sha": 5}', "sha"),
    "revision-nan": ("revision", b'{"sha": NaN}', "NaN"),
    "revision-duplicate-key": ("revision", b'{"sha": "' + b"a" * 40 + b'", "sha": "b"}', "duplicate"),
}


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
    if target == "hub_api":
        revision = {"id": "org/model", "sha": "5" * 40, "siblings": [{"rfilename": "Q4/a.gguf"}]}
        refused = [body for _kind, body, _says in HOSTILE_HUB_ANSWERS.values()]
        return [json.dumps(hub_tree()).encode(), json.dumps(revision).encode(), *refused]
    if target == "series":
        return [SERIES.read_bytes()]
    raise KeyError(target)
