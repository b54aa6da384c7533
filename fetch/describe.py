"""A new artifact set described from its GGUF headers, for a model nobody wrote a manifest for.

``dgr seal --artifacts NAME --from DIR|hub:...`` with a NAME no manifest folder has: what the set's
manifest would say by hand is read from the files instead: the architecture, the block count, the
split layout (the files in ``split.no`` order, their count) and the header values that fix the model's
shape (embedding width, heads, feed-forward width, experts, nextn layers, the tokenizer's kind), so
provisioning later holds every copy to them.  The manifest goes to the user's artifacts folder
(manifests.user_folder), never into the shipped one, and is written only once its files are sealed.

A folder must hold one model: one file, or the complete split set of one (a second model's files, a
missing shard or a file that is no GGUF are refused before anything is hashed).  Sealing an existing
set from a folder that holds another model is refused up front with what to do, rather than at the
first header that disagrees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ConfigurationError
from fetch.gguf_header import Header, MalformedGGUF, read_header
from manifests import user_folder
from manifests.artifact_sets import ArtifactSet

CHUNK_SIZE = 4 << 20  # the shipped sets' chunk: resumable downloads, one blake3 per 4 MiB
# llama_ftype (general.file_type) -> the variant name the shipped sets use for it
FILE_TYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    7: "q8_0",
    8: "q5_0",
    9: "q5_1",
    10: "q2_k",
    11: "q3_k_s",
    12: "q3_k_m",
    13: "q3_k_l",
    14: "q4_k_s",
    15: "q4_k_m",
    16: "q5_k_s",
    17: "q5_k_m",
    18: "q6_k",
    32: "bf16",
}
# ggml tensor type -> name, for a file that states no general.file_type (its largest tensor's type)
GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 8: "q8_0", 12: "q4_k", 14: "q6_k", 30: "bf16"}
# the header values (``ARCH.`` + suffix) that fix the model's shape, held where the file has them
SHAPE_KEYS = (
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "vocab_size",
    "expert_count",
    "expert_used_count",
    "nextn_predict_layers",
)
TOKENIZER = "tokenizer.ggml.model"


@dataclass(frozen=True, kw_only=True)
class Model:
    """One model's GGUF files in split order, as their headers say."""

    headers: tuple[Header, ...]

    @property
    def first(self) -> Header:
        return self.headers[0]

    @property
    def names(self) -> list[str]:
        return [h.path.name for h in self.headers]

    @property
    def architecture(self) -> str:
        arch = self.first.architecture
        assert arch is not None  # in_split_order refuses a file without one
        return arch

    @property
    def block_count(self) -> int:
        return int(self.first.arch_value("block_count"))

    def shape(self) -> str:
        """``llama, 2 blocks, 1 file``: what a message names the model by."""
        n = len(self.headers)
        return f"{self.architecture}, {self.block_count} blocks, {n} file{'s' if n > 1 else ''}"


def read_dir(source: Path) -> Model:
    """The one model in ``source`` (its ``*.gguf`` files), headers read and bound-checked."""
    if not source.is_dir():
        raise ConfigurationError(
            f"{source} is not a directory", hint="--from names the folder holding the model's .gguf files"
        )
    paths = sorted(p for p in source.glob("*.gguf") if p.is_file())
    if not paths:
        raise ConfigurationError(
            f"{source} holds no .gguf files", hint="give the folder of the model's files"
        )
    return in_split_order([read_header(p) for p in paths], where=str(source))


def _split_no(header: Header) -> int:
    value = header.kv.get("split.no", 0)
    return value if isinstance(value, int) else -1


def in_split_order(headers: Sequence[Header], *, where: str) -> Model:
    """The headers of one model's files in ``split.no`` order: refused when they are several models'
    files, when a shard is missing, or when the first names no architecture and block count."""
    firsts = [h.path.name for h in headers if _split_no(h) == 0]
    if len(firsts) > 1:
        raise ConfigurationError(
            f"{where} holds {len(firsts)} models ({', '.join(firsts)})",
            hint="give a folder with one model's files (one .gguf, or one split set)",
        )
    ordered = sorted(headers, key=_split_no)
    count = ordered[0].kv.get("split.count", 1)
    numbers = [_split_no(h) for h in ordered]
    if not isinstance(count, int) or numbers != list(range(count)):
        missing = [k + 1 for k in range(count if isinstance(count, int) else 0) if k not in numbers]
        detail = f"split {missing[0]} of {count} is missing" if missing else f"split numbers {numbers}"
        raise MalformedGGUF(f"{where}: not one complete split set: {detail}")
    first = ordered[0]
    blocks = first.arch_value("block_count")
    if first.architecture is None or not isinstance(blocks, int) or blocks < 1:
        raise MalformedGGUF(f"{first.path.name}: no general.architecture and ARCH.block_count in its header")
    return Model(headers=tuple(ordered))


def variant_name(header: Header) -> str:
    """The variant a file is, as the shipped sets name them: its general.file_type, else the type of
    its largest tensor (``default`` when neither is a known one)."""
    ftype = header.kv.get("general.file_type")
    if isinstance(ftype, int):
        return FILE_TYPES.get(ftype, "default")
    if not header.tensors:
        return "default"
    largest = max(header.tensors, key=lambda t: t.nbytes)
    return GGML_TYPES.get(largest.ggml_type, "default")


def expectations(model: Model) -> dict[str, Any]:
    """The manifest's ``gguf``: what every copy's headers must show (check_set holds them)."""
    first, arch = model.first, model.architecture
    kv: dict[str, Any] = {}
    for key in ("general.file_type", TOKENIZER, *(f"{arch}.{s}" for s in SHAPE_KEYS)):
        value = first.kv.get(key)
        if isinstance(value, bool | int | float | str):
            kv[key] = value
    return {
        "architecture": arch,
        "block_count": model.block_count,
        "split_count": len(model.headers),
        "kv": kv,
    }


def _describe(name: str, model: Model, where: str) -> str:
    return (
        f"A model brought by its user ({model.shape()}): `dgr seal --artifacts {name} --from {where}` read "
        "this manifest from the files' GGUF headers (architecture, block count, split layout, the values "
        "that fix its shape) and sealed their digests. Provisioning fetches them from the origin below and "
        "holds every copy to both."
    )


def manifest(
    name: str, model: Model, origin: dict[str, Any], *, variant: str | None, where: str
) -> dict[str, Any]:
    """The new set's manifest, its files listed in split order and not yet sealed (``dgr seal`` hashes)."""
    vname = variant or variant_name(model.first)
    general = model.first.kv.get("general.name")
    return {
        "schema_version": 1,
        "name": name,
        "description": _describe(name, model, where),
        **({"model": general} if isinstance(general, str) and general not in ("", "n/a") else {}),
        "storage": "any",
        "origins": [origin],
        "default_variant": vname,
        "variants": {
            vname: {
                "chunk_size": CHUNK_SIZE,
                "chunk_digest": "blake3",
                "description": f"as read from {model.names[0]}'s header",
                "gguf": expectations(model),
                "files": [{"name": n} for n in model.names],
            }
        },
    }


def target(name: str, env: Mapping[str, str]) -> Path:
    """Where the new set's manifest goes: the user's artifacts folder (made on first use)."""
    return user_folder.make(user_folder.artifacts_dir(env)) / f"{name}.json"


def hold_to_existing(path: Path, aset: ArtifactSet, variant: str | None, source: Path) -> None:
    """Sealing existing set ``aset`` from ``source``: refused up front when the folder's first file is
    another model (architecture or block count), saying what to do; else sealing holds every header."""
    g = aset.variant(variant).gguf
    listed = [source / f.name for f in aset.variant(variant).files][:1]
    first = next(iter([p for p in listed if p.is_file()] or sorted(source.glob("*.gguf"))), None)
    if first is None or not first.is_file():
        return  # sealing says what is missing
    header = read_header(first)
    shape = (header.architecture, header.arch_value("block_count"))
    if shape == (g.architecture, g.block_count):
        return
    hint = (
        "it is a shipped set: give the new one a name of its own (--artifacts NAME)"
        if user_folder.is_shipped(path)
        else f"give the new set a name of its own (--artifacts NAME), or remove {path} to describe it afresh"
    )
    raise ConfigurationError(
        f"artifact set {aset.name!r} ({path}) is a {g.architecture} of {g.block_count} blocks; "
        f"{first.name} is a {shape[0]} of {shape[1]} blocks",
        hint=hint,
    )


@dataclass(kw_only=True)
class HubDraft:
    """A new set's manifest while its files download from the hub: nothing about the model is known
    until its headers are, so the variant is keyed ``variant`` until ``describe`` names it."""

    name: str
    ref: str
    chosen: str | None = None  # --variant, else the files' type
    variant: str = "pending"
    data: dict[str, Any] = field(default_factory=dict[str, Any])

    def __post_init__(self) -> None:
        self.data = {
            "schema_version": 1,
            "name": self.name,
            "description": "",
            "storage": "any",
            "origins": [],  # the hub origin, added and recorded by sealing
            "default_variant": self.variant,
            "variants": {self.variant: {"chunk_size": CHUNK_SIZE, "chunk_digest": "blake3", "files": []}},
        }

    def describe(self, paths: Sequence[Path]) -> str:
        """Fill in the model from the downloaded files' headers; returns the variant's name."""
        model = in_split_order([read_header(p) for p in paths], where=f"hub:{self.ref}")
        drafted = manifest(self.name, model, {}, variant=self.chosen, where=f"hub:{self.ref}")
        vname: str = drafted["default_variant"]
        vdata = self.data["variants"].pop(self.variant)
        vdata.update({k: v for k, v in drafted["variants"][vname].items() if k != "files"})
        self.data["variants"][vname] = vdata
        self.data.update(description=drafted["description"], default_variant=vname)
        self.data.update({k: drafted[k] for k in ("model",) if k in drafted})
        self.variant = vname
        return vname
