"""A worker's identity: the file an operator starts an attached worker with, and the check of what
the worker reports (Info) against what this certifier computed for the recipe.

``dgr certify --write-identity FILE`` writes the stable identity of a recipe on a lane (no run id):
recipe name and digest, lane, artifact set / variant / manifest digest, pinned source commit and tree,
patch stack digest and the digest of worker/'s sources, with the host's build recorded.  Before an
attached worker is trusted its Info must match field by field (pipeline/attached.py); one mismatch is
a ConfigurationError (exit 2) naming the worker, the placement, the field, expected and got.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from core.canonical import BadJson, is_json_object, parse_json
from core.errors import ConfigurationError
from manifests.recipe_model import Recipe
from worker.client import StageInfo

IDENTITY_KIND = "dgr.worker-identity"
IDENTITY_VERSION = 1
# Fields of the worker's identity file that must equal the certifier's, in the order they are reported.
# The build (key, binaries) is per machine and only recorded: each host compiles with its own toolchain,
# so its build key differs while source, patch stack and worker sources are the same; whether that build
# computes the same numbers is exactly what the parity gates measure.
COMPARED = (
    "kind",
    "schema_version",
    "recipe.name",
    "recipe.digest",
    "lane",
    "artifacts.set",
    "artifacts.variant",
    "artifacts.manifest_digest",
    "source.commit",
    "source.tree",
    "patches.digest",
    "worker_source",
)
_HEX = re.compile(r"^[0-9a-f]{32,}$")


def stable_identity(recipe: Recipe, lane: str, identity: Mapping[str, Any]) -> dict[str, Any]:
    """What a worker serving ``recipe`` on ``lane`` must carry (``--identity``): no run id, nothing that
    differs between certifier and worker host except the recorded build."""
    from lanes.build import worker_digest

    src: Mapping[str, Any] = identity.get("source") or {}
    art: Mapping[str, Any] = identity.get("artifacts") or {}
    patches: Mapping[str, Any] = identity.get("patches") or {}
    build = identity.get("build") or None
    return {
        "kind": IDENTITY_KIND,
        "schema_version": IDENTITY_VERSION,
        "recipe": {"name": recipe.name, "digest": recipe.digest},
        "lane": lane,
        "artifacts": {k: art.get(k) for k in ("set", "variant", "manifest_digest")},
        "source": {"commit": src.get("commit"), "tree": src.get("tree")},
        "patches": {"digest": patches.get("digest")},
        "worker_source": worker_digest(),
        "build": {"lane": build.get("lane"), "key": build.get("key")} if build else None,
    }


def model_shape(first_file: Path) -> dict[str, Any]:
    """n_embd and n_vocab from the (provisioned, verified) model's GGUF header: a worker that loaded
    another model is caught by its shape even when it was handed a copy of the right identity file."""
    from fetch.gguf_header import ArrayInfo, read_header

    header = read_header(Path(first_file))
    tokens = header.kv.get("tokenizer.ggml.tokens")
    n_embd = header.arch_value("embedding_length")
    return {
        "n_embd": int(n_embd) if isinstance(n_embd, int) else None,
        "n_vocab": int(tokens.count) if isinstance(tokens, ArrayInfo) else None,
    }


def _is_mapping(value: object) -> TypeGuard[Mapping[str, object]]:
    """An identity document or one of its sections (parsed JSON, or the certifier's own mapping)."""
    return isinstance(value, Mapping)


def _get(doc: object, path: str) -> object:
    for part in path.split("."):
        doc = doc.get(part) if _is_mapping(doc) else None
    return doc


def _show(value: Any) -> str:
    if isinstance(value, str) and _HEX.match(value):
        return value[:16] + "…"
    return json.dumps(value) if not isinstance(value, str) else value


@dataclass(frozen=True, kw_only=True)
class Expect:
    """What one attached stage must report."""

    identity: Mapping[str, Any]  # stable_identity() for the worker's lane
    placement: str
    stage: int
    n_stages: int
    layers: tuple[int, int]
    architecture: str
    n_layer: int
    # n_embd, n_vocab: from the verified local GGUF header, a model's shape whatever its identity file says
    n_embd: int | None = None
    n_vocab: int | None = None
    min_ctx: int = 0


def mismatches(info: StageInfo, want: Expect) -> list[tuple[str, str, str]]:
    """(field, expected, got) for every way ``info`` differs from ``want``; empty when it matches."""
    out: list[tuple[str, str, str]] = []

    def differ(name: str, expected: Any, got: Any) -> None:
        if expected != got:
            out.append((name, _show(expected), _show(got)))

    try:  # the worker's own words: read with the bounded reader like any untrusted JSON
        doc = parse_json(info.identity_json, source="identity") if info.identity_json.strip() else None
    except BadJson:
        doc = "not JSON"
    if not is_json_object(doc):
        out.append(
            (
                "identity",
                f"a {IDENTITY_KIND} document (dgr certify --write-identity)",
                "none" if doc is None else "not a JSON object",
            )
        )
    else:
        for path in COMPARED:
            differ(f"identity.{path}", _get(want.identity, path), _get(doc, path))
    differ("lane", want.identity.get("lane"), info.lane)
    differ("llama_commit", _get(want.identity, "source.commit"), info.llama_commit)
    differ("architecture", want.architecture, info.architecture)
    differ("n_layer", want.n_layer, info.n_layer)
    if want.n_embd is not None:
        differ("n_embd", want.n_embd, info.n_embd)
    if want.n_vocab is not None:
        differ("n_vocab", want.n_vocab, info.n_vocab)
    differ("layers", f"{want.layers[0]}:{want.layers[1]}", f"{info.layer_begin}:{info.layer_end}")
    differ("first_stage", want.stage == 0, info.first_stage)
    differ("last_stage", want.stage == want.n_stages - 1, info.last_stage)
    if info.n_ctx < want.min_ctx:
        out.append(("n_ctx", f">= {want.min_ctx}", str(info.n_ctx)))
    return out


def check_worker(info: StageInfo, want: Expect, address: str) -> None:
    """ConfigurationError (exit 2), one line: worker, placement, the first field, expected vs got."""
    found = mismatches(info, want)
    if not found:
        return
    name, expected, got = found[0]
    more = f" (also: {', '.join(f[0] for f in found[1:])})" if len(found) > 1 else ""
    raise ConfigurationError(
        f"attached worker {address} (placement {want.placement}, stage {want.stage}) does not match the "
        f"recipe: {name}: expected {expected}, got {got}{more}",
        hint="start it with --layers and --identity from `dgr certify --recipe R --lane L --write-identity "
        "FILE` made from this checkout; the certifier never trusts a worker it cannot match",
    )
