"""Provision an artifact set into the store: exact, resumable, verified, published atomically.

``provision(ctx, "tiny-llama", variant="f32")`` returns a ``Provisioned`` naming the files in split
order.  Per file: trust the sidecar (one stat) unless ``reverify``; otherwise take the per-file lock
and hash what is there; else open the partial + ledger, fill the missing chunks from the first origin
that works (HTTP(S), a local directory, the generator or the package index, into staging), check the
whole-file digest and the GGUF header, publish by rename.  The set is declared ready only after every
split header has been held against the manifest together (``gguf_header.check_set``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import redact
from core.canonical import canonical_bytes, read_json, write_json
from core.context import Context
from core.errors import DgrError, IntegrityError, RuntimeFailure
from core.locks import pid_alive
from core.workspace import env_store, refuse_links_below
from fetch import gguf_header, ledger
from fetch.download import RetryPolicy, Stats, copy_local, fetch_http
from fetch.progress import Progress, factory
from fetch.store import check_policy, ensure_store, file_lock, free_bytes, preflight, prepare_dir, publish
from fetch.tools import NO_TOOLS, Tools
from manifests.artifact_sets import (
    DEFAULT_SET,
    ArtifactFile,
    ArtifactSet,
    Origin,
    Variant,
    expand_path,
    load_set,
    require_sealed,
)

log = redact.logger("dgr.provision")
PROVENANCE = "provenance.json"
PROVENANCE_VERSION = 1

ProgressFactory = Callable[..., Progress]  # (label, total, initial=0) -> Progress (fetch.progress.factory)


@dataclass(frozen=True, kw_only=True)
class Provisioned:
    set_name: str
    variant: str
    store: Path  # the variant directory: <store>/<set>/<variant>
    files: tuple[Path, ...]  # split order
    manifest_digest: str
    provenance: Mapping[str, Any]
    provenance_path: Path
    bytes_fetched: int = 0  # bytes received from origins in this run
    bytes_hashed: int = 0  # bytes hashed to verify existing files (not counting chunks as they land)
    reused: int = 0  # files trusted from the sidecar with a stat
    seconds: float = 0.0
    staged: Path | None = None  # the staging folder this run made (generated or index origins), then removed

    @property
    def first(self) -> Path:
        return self.files[0]


def provision(
    ctx: Context,
    set_name: str | None = None,
    *,
    variant: str | None = None,
    store: str | os.PathLike[str] | None = None,
    reverify: bool = False,
    progress: ProgressFactory | None = None,
    policy: RetryPolicy | None = None,
    lock_wait_s: float = 0.0,
    manifests: Path | None = None,  # the folder of the set's manifest (default: the user's, then ours)
    free: Callable[[Path], int] = free_bytes,
    tools: Tools = NO_TOOLS,
) -> Provisioned:
    """Provision one variant of an artifact set into the store (the module's docstring says how)."""
    started = time.monotonic()
    aset = load_set(set_name or DEFAULT_SET, root=manifests, env=ctx.env)
    vname = aset.variant_name(variant)
    spec = require_sealed(aset, vname)
    root, vdir = _variant_dir(ctx, aset, vname, store)
    run = _Run(
        ctx=ctx,
        aset=aset,
        vname=vname,
        spec=spec,
        root=root,
        vdir=vdir,
        policy=policy or RetryPolicy(),
        make_bar=progress or factory(),
        lock_wait_s=lock_wait_s,
        tools=tools,
    )
    records = ledger.read_sidecar(vdir, aset.digest)
    dests = [_dest(root, vdir, f) for f in spec.files]
    todo = run.untrusted(records, dests, reverify=reverify)
    if not todo and records.set_checked:
        return run.result(dests, started)
    run.plan(todo, dests, free)
    try:
        run.fill_all(records, todo, dests)
    finally:
        run.cleanup()
    return run.result(dests, started)


def _variant_dir(
    ctx: Context, aset: ArtifactSet, vname: str, store: str | os.PathLike[str] | None
) -> tuple[Path, Path]:
    """The store root and the variant's directory in it (<store>/<set>/<variant>), made only once the
    set's storage policy accepts that store: nothing is written where the set may not live."""
    root = env_store(ctx.env, os.fspath(store) if store is not None else None, ctx.workspace)
    check_policy(root, aset.storage, aset.name)
    ensure_store(root)
    return root, prepare_dir(root, root / aset.name / vname)


def _dest(root: Path, vdir: Path, entry: ArtifactFile) -> Path:
    dest = vdir / entry.name
    if dest.parent != vdir:
        prepare_dir(root, dest.parent)
    refuse_links_below(root, dest)
    return dest


def _drop_leftovers(dest: Path) -> None:
    """A partial + ledger left by a killed run for a file that is now published and verified.

    Safe even if another run still writes into that partial: it keeps its descriptor, its rename
    then finds the name gone and it checks the published file instead.
    """
    for leftover in (dest.with_name(f".{dest.name}.part"), dest.with_name(f".{dest.name}.ledger")):
        if leftover.is_symlink() or leftover.is_file():
            leftover.unlink(missing_ok=True)


_STAGED_BY = re.compile(r"-pid(\d+)-[^/]*$")


def sweep_staging(staging: Path) -> list[Path]:
    """Remove staging folders whose run is gone (kill -9, a crash): their pid is in their name."""
    removed = []
    for old in staging.iterdir() if staging.is_dir() else ():
        m = _STAGED_BY.search(old.name)
        if not m or old.is_symlink() or not old.is_dir():
            continue
        if int(m[1]) == os.getpid() or pid_alive(int(m[1])):
            continue
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed


def _remaining(entry: ArtifactFile, dest: Path, *, existing: bool = True) -> int:
    """Bytes still to land on disk: the partial is sparse, so its allocated blocks are already paid for.
    ``existing``: a right-size file under the final name counts as present (it is hashed later)."""
    assert entry.size is not None
    if existing and dest.is_file() and not dest.is_symlink() and dest.stat().st_size == entry.size:
        return 0
    part = dest.with_name(f".{dest.name}.part")
    try:
        have = part.lstat().st_blocks * 512
    except FileNotFoundError:
        have = 0
    return max(entry.size - have, 0)


@dataclass
class _Run:
    ctx: Context
    aset: ArtifactSet
    vname: str
    spec: Variant
    root: Path
    vdir: Path
    policy: RetryPolicy
    make_bar: ProgressFactory
    lock_wait_s: float
    tools: Tools = NO_TOOLS
    free: Callable[[Path], int] = free_bytes
    later: dict[int, int] = field(default_factory=dict)  # bytes still to fetch for the files after each
    reused: int = 0
    bytes_fetched: int = 0
    bytes_hashed: int = 0
    _generated: Path | None = None
    staged: Path | None = None  # _generated's path, kept after cleanup for the result
    headers: dict[int, gguf_header.Header] = field(default_factory=dict)

    def untrusted(self, records: ledger.Sidecar, dests: list[Path], *, reverify: bool) -> list[int]:
        """The indexes of the files the sidecar cannot vouch for with a stat (all of them on
        ``reverify``): only these are locked, hashed or fetched; the others count as reused."""
        todo: list[int] = []
        for i, (entry, dest) in enumerate(zip(self.spec.files, dests, strict=True)):
            if not reverify and ledger.sidecar_trusts(
                records.files.get(entry.name), dest, entry, self.spec.chunk_size
            ):
                self.reused += 1
            else:
                todo.append(i)
        return todo

    def plan(self, todo: list[int], dests: list[Path], free: Callable[[Path], int]) -> None:
        """Refuse a set that cannot fit before any byte lands, and remember what the files after each
        one still need, so a disk that fills later can say how much the whole set wants."""
        still = {i: _remaining(self.spec.files[i], dests[i]) for i in todo}
        preflight(self.vdir, sum(still.values()), free=free)
        self.free = free
        self.later = {i: sum(still[j] for j in todo if j > i) for i in todo}

    def fill_all(self, records: ledger.Sidecar, todo: list[int], dests: list[Path]) -> None:
        """Verify or fetch each file in ``todo``, recording it in the sidecar as it is done (an
        interrupted run keeps what it finished); the set counts as checked only once every split
        header has been held against the manifest together."""
        files = self.spec.files
        records.set_checked = False  # until the headers below are held against the manifest together
        for i in todo:
            records.files[files[i].name] = self.one(i, files[i], dests[i])
            ledger.write_sidecar(self.vdir, self.aset.digest, records)
        headers = [self.headers.get(i) or gguf_header.read_header(d) for i, d in enumerate(dests)]
        gguf_header.check_set(headers, self.spec.gguf)
        records.set_checked = True
        ledger.write_sidecar(self.vdir, self.aset.digest, records)

    def one(self, index: int, entry: ArtifactFile, dest: Path) -> dict[str, Any]:
        with file_lock(dest, wait_s=self.lock_wait_s):
            if dest.is_symlink():
                raise IntegrityError(
                    f"{dest} is a symbolic link; refusing to use it", hint="remove the link and retry"
                )
            if dest.exists():
                if self._hash_ok(dest, entry):
                    self._check_header(dest, index)
                    _drop_leftovers(dest)
                    return ledger.sidecar_record(dest, entry, self.spec.chunk_size)
                log.warning("%s does not match the manifest; fetching it again", dest)
                # The preflight counted a right-size file as present; it stays until the new one is
                # published, so the whole file must fit beside it.
                preflight(
                    dest.parent,
                    _remaining(entry, dest, existing=False) + self.later.get(index, 0),
                    free=self.free,
                )
            self._fill(index, entry, dest)
            return ledger.sidecar_record(dest, entry, self.spec.chunk_size)

    def _hash_ok(self, path: Path, entry: ArtifactFile) -> bool:
        if path.stat().st_size != entry.size:
            return False
        assert entry.size is not None
        with self.make_bar(f"verify {entry.name}", entry.size) as bar:
            actual = ledger.blake3_file(path, on_bytes=bar.update)
        self.bytes_hashed += entry.size
        return actual == entry.blake3

    def _check_header(self, path: Path, index: int, fd: int | None = None) -> None:
        header = gguf_header.read_header(path, fd=fd)
        self.headers[index] = header  # the set-level check reuses it
        gguf_header.check_file(header, index, len(self.spec.files), self.spec.gguf)

    def _fill(self, index: int, entry: ArtifactFile, dest: Path) -> None:
        """Resume the file's partial (its verified chunks hashed again), fill it, publish it."""
        assert entry.size is not None
        with self.make_bar(f"recheck {entry.name}", entry.size) as bar:  # resumed chunks are hashed again
            partial = ledger.open_partial(dest, entry, self.spec.chunk_size, on_rehash=bar.update)
        try:
            self._serve(index, entry, dest, partial)
            self._publish(index, entry, dest, partial)
        finally:
            partial.close()

    def _serve(self, index: int, entry: ArtifactFile, dest: Path, partial: ledger.Partial) -> None:
        """Fill the partial's missing chunks from the first origin that works, in the manifest's order
        (a partial finished by an earlier run needs none).  A failing origin is logged and the next one
        tried; a full disk stops at once, since no origin can help with that."""
        assert entry.size is not None
        errors: list[DgrError] = []
        served = not partial.missing()  # a partial finished by an earlier run needs no origin
        for origin in self.aset.origins:
            if served:
                break
            stats = Stats()
            with self.make_bar(f"fetch {entry.name}", entry.size, initial=partial.bytes_verified) as bar:
                try:
                    self._from_origin(origin, partial, stats, bar.update)
                    served = True
                except ledger.DiskFull as exc:
                    raise self._disk_full(index, entry, dest, partial) from exc
                except DgrError as exc:
                    log.warning("origin %s failed for %s: %s", _origin_text(origin), entry.name, exc.message)
                    errors.append(exc)
                finally:
                    self.bytes_fetched += stats.bytes_received
        if not served or partial.missing():  # an origin that misbehaved fails the run, even past the end
            raise errors[-1] if errors else RuntimeFailure(f"{entry.name}: no origin could provide it")

    def _disk_full(
        self, index: int, entry: ArtifactFile, dest: Path, partial: ledger.Partial
    ) -> RuntimeFailure:
        """A full disk keeps what is verified; the message says how much more this file and the rest
        of the set need, so the next run (after freeing space) can finish."""
        assert entry.size is not None
        need = entry.size - partial.bytes_verified
        total = need + self.later.get(index, 0)
        return RuntimeFailure(
            f"disk full writing {dest.name}: {partial.bytes_verified} of {entry.size} bytes "
            f"verified and kept; need {need} more bytes for this file, {total} bytes for the "
            f"whole set (free {free_bytes(dest.parent)})",
            hint="free space (or use a larger --store) and run again to resume",
        )

    def _publish(self, index: int, entry: ArtifactFile, dest: Path, partial: ledger.Partial) -> None:
        """Only a partial of exactly the manifest's size, whose whole-file digest and GGUF header
        match, is renamed into place.  A digest mismatch means the manifest's chunk and file digests
        disagree: the partial and its ledger go.  A file another run published first is hashed."""
        assert entry.size is not None
        partial.maybe_sync(force=True)
        size = os.fstat(partial.fd).st_size
        if size != entry.size:  # the stream digest covers entry.size bytes only: never publish a tail
            raise IntegrityError(
                f"{entry.name}: the partial holds {size} bytes, the manifest says "
                f"{entry.size}; not published",
                hint="run again to refit the partial",
            )
        actual = partial.whole_digest()
        if actual is None:  # chunks came out of order (resume, refetch): read the file once more
            with self.make_bar(f"verify {entry.name}", entry.size) as bar:
                actual = ledger.blake3_fd(partial.fd, on_bytes=bar.update)
        if actual != entry.blake3:
            partial.close()
            partial.path.unlink(missing_ok=True)
            partial.discard_ledger()
            raise IntegrityError(
                f"{entry.name}: whole-file blake3 mismatch: expected {entry.blake3}, "
                f"got {actual}; not published",
                hint="the manifest's chunk and file digests disagree; re-seal it",
            )
        self._check_header(dest, index, fd=partial.fd)
        if not publish(partial.path, dest, partial.fd) and not self._hash_ok(dest, entry):
            raise IntegrityError(f"{dest}: another run published a file that does not match the manifest")
        partial.discard_ledger()

    def _from_origin(
        self, origin: Origin, partial: ledger.Partial, stats: Stats, on_bytes: Callable[[int], None]
    ) -> None:
        if origin.kind == "http":
            fetch_http(origin, partial, policy=self.policy, stats=stats, on_bytes=on_bytes)
        elif origin.kind == "local":
            assert origin.path is not None
            copy_local(
                expand_path(origin.path, self.ctx.env),
                partial,
                policy=self.policy,
                stats=stats,
                on_bytes=on_bytes,
            )
        elif origin.kind == "generated":
            copy_local(self._generate(origin), partial, policy=self.policy, stats=stats, on_bytes=on_bytes)
        elif origin.kind == "package-index":
            copy_local(self._from_index(origin), partial, policy=self.policy, stats=stats, on_bytes=on_bytes)
        elif origin.kind == "hub":
            from fetch import hub

            hub.fetch_hub(
                origin, partial, env=self.ctx.env, policy=self.policy, stats=stats, on_bytes=on_bytes
            )
        else:  # pragma: no cover - the schema admits no other kind
            raise RuntimeFailure(f"unknown origin kind {origin.kind!r}")

    def _generate(self, origin: Origin) -> Path:
        """Regenerate the synthetic set into staging once per run; verified like any download."""
        if self._generated is None:
            from fetch import generated, source

            tree = source.ensure_pristine(self.ctx).path
            out = self._staging_dir()
            params = {**dict(origin.parameters), **dict(self.spec.parameters)}
            try:
                generated.generate(origin.generator, out, params, self.vname, tree=tree, tools=self.tools)
            except BaseException:
                shutil.rmtree(out, ignore_errors=True)  # a failed generation leaves nothing behind
                raise
            self._generated = out
        return self._generated

    def _from_index(self, origin: Origin) -> Path:
        """Wheels -> upstream-verified file -> pinned split, into staging once per run."""
        if self._generated is None:
            from fetch import origin_index

            out = self._staging_dir()
            try:
                origin_index.produce(
                    origin, out / "split", out / "scratch", self.ctx.env, split_tool=self.tools.split
                )
            except BaseException:
                shutil.rmtree(out, ignore_errors=True)
                raise
            self._generated = out
        return self._generated / "split"

    def _staging_dir(self) -> Path:
        """A fresh folder under staging named after this process; folders of dead runs are swept."""
        staging = self.ctx.workspace.ensure(self.ctx.workspace.staging)
        sweep_staging(staging)
        self.staged = Path(
            tempfile.mkdtemp(prefix=f"{self.aset.name}-{self.vname}-pid{os.getpid()}-", dir=staging)
        )
        return self.staged

    def cleanup(self) -> None:
        """Remove this run's staging folder; a folder that will not go is said, not silently kept (a
        later run sweeps it only once this process is gone)."""
        if self._generated is None:
            return
        try:
            shutil.rmtree(self._generated)
        except OSError as exc:
            log.warning("could not remove the staging folder %s: %s", self._generated, exc)
        self._generated = None

    def result(self, dests: list[Path], started: float) -> Provisioned:
        prov = provenance_record(self.aset, self.vname, self.spec)
        path = self.vdir / PROVENANCE
        if not _same_json(path, prov):
            write_json(path, prov)
        return Provisioned(
            set_name=self.aset.name,
            variant=self.vname,
            store=self.vdir,
            files=tuple(dests),
            manifest_digest=self.aset.digest,
            provenance=prov,
            provenance_path=path,
            bytes_fetched=self.bytes_fetched,
            bytes_hashed=self.bytes_hashed,
            reused=self.reused,
            seconds=time.monotonic() - started,
            staged=self.staged,
        )


def provenance_record(aset: ArtifactSet, vname: str, spec: Variant) -> dict[str, Any]:
    """The artifacts link of the identity chain; identical for every run over the same manifest."""
    g = spec.gguf
    return {
        "schema_version": PROVENANCE_VERSION,
        "stage": "artifacts",
        "set": aset.name,
        "variant": vname,
        "manifest_digest": aset.digest,
        "storage": aset.storage,
        **{k: v for k, v in (("model", aset.model), ("source", aset.source), ("license", aset.license)) if v},
        **_upstream(aset),
        "chunk_size": spec.chunk_size,
        "chunk_digest": spec.chunk_digest,
        "gguf": {
            "architecture": g.architecture,
            "block_count": g.block_count,
            "split_count": g.split_count,
            "tensor_counts": list(g.tensor_counts or ()),
        },
        "files": [
            {
                "name": f.name,
                "size": f.size,
                "sha256": f.sha256,
                "blake3": f.blake3,
                "chunk_size": spec.chunk_size,
                "chunks": list(f.chunks or ()),
            }
            for f in spec.files
        ],
    }


def _upstream(aset: ArtifactSet) -> dict[str, Any]:
    """A set rebuilt from package-index wheels names the upstream file and the pinned wheels."""
    for o in aset.origins:
        if o.kind == "package-index" and o.assembled is not None:
            return {
                "upstream": {
                    "file": o.assembled.name,
                    "size": o.assembled.size,
                    "sha256": o.assembled.sha256,
                    "packages": [
                        {"name": p.name, "version": p.version, "sha256": p.sha256} for p in o.packages
                    ],
                }
            }
    return {}


def _same_json(path: Path, value: Any) -> bool:
    try:
        return canonical_bytes(read_json(path)) == canonical_bytes(value)
    except (OSError, ValueError):
        return False


def _origin_text(origin: Origin) -> str:
    if origin.generator:
        return f"generated:{origin.generator}"
    if origin.kind == "hub":
        return f"hub:{origin.repo}@{origin.revision}"
    return origin.base_url or origin.path or origin.kind  # a package-index origin names no place
