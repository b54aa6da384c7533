"""One function per parser of untrusted input: bytes in, the parser's answer or its typed error out.

Each target returns normally when the input parses or is refused with a ``core.errors.DgrError``
(the project's typed errors, each with its exit code); any other exception escapes, and that is a
finding.  Inputs are what an attacker controls: a file's bytes.  Scratch files live in one private
folder per process (tmpfs where there is one), emptied after each input.
"""

from __future__ import annotations

import atexit
import gzip
import io
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.canonical import parse_json
from core.errors import DgrError  # also what the fuzz drivers catch

_SCRATCH: Path | None = None


def scratch() -> Path:
    """``DGR_FUZZ_SCRATCH`` (the fuzz runner's, removed by it), else a private folder removed at exit."""
    global _SCRATCH
    if _SCRATCH is None:
        given = os.environ.get("DGR_FUZZ_SCRATCH")
        if given:
            _SCRATCH = Path(given)
            _SCRATCH.mkdir(parents=True, exist_ok=True)
        else:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            _SCRATCH = Path(tempfile.mkdtemp(prefix="dgr-fuzz-", dir=base))
            atexit.register(shutil.rmtree, _SCRATCH, True)
    return _SCRATCH


def _empty(folder: Path) -> Path:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return folder


def gguf_header(data: bytes) -> None:
    """fetch.gguf_header.read_header over a file holding ``data`` (through an open descriptor)."""
    from fetch import gguf_header as gh

    fd = os.memfd_create("fuzz.gguf")
    try:
        os.write(fd, data)
        gh.read_header(Path("fuzz.gguf"), fd=fd)
    finally:
        os.close(fd)


ARCHIVE_PREFIX = "llama-cpp-python-0.3.35/vendor/llama.cpp"


def archive(data: bytes) -> None:
    """fetch.archive.extract_subtree over ``data`` as the tar inside a .tar.gz (the fuzzer shapes the
    tar headers; gzip is the stdlib's), into a fresh folder."""
    from fetch import archive as ar

    dest = _empty(scratch())
    blob = io.BytesIO(gzip.compress(data, compresslevel=1, mtime=0))
    ar.extract_subtree(
        Path("fuzz.tar.gz"),
        ARCHIVE_PREFIX,
        dest,
        ar.Caps(max_members=64, max_bytes=1 << 20),
        where="fuzz",
        fileobj=blob,
    )
    _empty(dest)


def patch(data: bytes) -> None:
    """patches.stack.touched_paths: the patch judge (paths, modes, headers) over a patch's bytes."""
    from patches import stack

    stack.touched_paths(data, "fuzz.patch")
    stack.git_mode(data.decode("utf-8", "surrogateescape"))


def json_reader(data: bytes) -> None:
    """core.canonical.parse_json, the bounded reader (plain and signed)."""
    parse_json(data, source="fuzz.json")


def recipe(data: bytes) -> None:
    """manifests.recipe_model.load_file over a recipe file holding ``data``."""
    from manifests import recipe_model as recipes

    path = scratch() / "fuzz-recipe.json"
    path.write_bytes(data)
    recipes.load_file(path)


def artifact_set(data: bytes) -> None:
    """manifests.artifact_sets: the manifest reader load_set runs on bytes (parse_json, parse_set)."""
    from manifests import artifact_sets as artifacts

    artifacts.parse_set(parse_json(data, source="fuzz-set.json"), source="fuzz-set.json")


def hub_api(data: bytes) -> None:
    """fetch.hub's readers of the hub's API answers over the same bytes: a revision answer (the commit
    it names), then a tree listing page (its files, and the index that refuses a path listed twice or
    as a file and a folder)."""
    from fetch import hub

    try:
        hub.read_commit(data, source="fuzz-revision.json", repo="org/fuzz", revision="main")
    except DgrError:
        pass  # refused as a revision answer: the tree reader still gets its turn
    hub.index_files(hub.read_tree_page(data, source="fuzz-tree.json"), source="fuzz-tree.json")


def series(data: bytes) -> None:
    """patches.stack.read_series over a patches folder whose ``series`` file holds ``data``."""
    from patches import stack

    (scratch() / "series").write_bytes(data)
    stack.read_series(scratch())


TARGETS: dict[str, Callable[[bytes], None]] = {
    "gguf_header": gguf_header,
    "archive": archive,
    "patch": patch,
    "json": json_reader,
    "recipe": recipe,
    "artifact_set": artifact_set,
    "hub_api": hub_api,
    "series": series,
}


def run_one(name: str, data: bytes) -> bool:
    """Feed one input; True when it parsed, False when refused with a typed error."""
    try:
        TARGETS[name](data)
    except DgrError:
        return False
    return True
