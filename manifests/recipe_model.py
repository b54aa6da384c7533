"""Certification recipes: what is certified (artifact set, variant, lanes), how (placements, prompts,
decode length, boundary dtype) and the gates' thresholds per hardware class, all pre-locked.

A recipe is loaded once, validated against ``manifests/schemas/recipe.schema.json`` (unknown keys are
named with a typo hint), checked for the things a schema cannot say (placements tile the layers,
exactly one monolithic reference, MTP off) and returned as frozen dataclasses.  Its identity is the
sha256 of its canonical JSON: changing a threshold changes the recipe digest.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.canonical import canonical_digest, is_json_object, read_json
from core.errors import ConfigurationError
from core.workspace import MANIFESTS
from manifests import user_folder
from manifests.loader import build, validate
from manifests.tiling import Break, first_break

RECIPES = MANIFESTS / "recipes"
DEFAULT_RECIPE = "tiny-llama"
REFERENCE_LANE = "cpu"  # the lane whose monolithic run every other lane's is held to
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True, kw_only=True)
class Seam:
    delay_ms: float | None = None
    jitter_ms: float | None = None
    rate_mbit: float | None = None


@dataclass(frozen=True, kw_only=True)
class Placement:
    """A certification scenario: contiguous [begin, end) layer ranges, one per stage."""

    name: str
    stages: tuple[tuple[int, int], ...]
    description: str = ""
    forwarding: str = "relayed"
    boundary_dtype: str | None = None
    seams: tuple[Seam, ...] = ()

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def is_monolithic(self) -> bool:
        return len(self.stages) == 1

    @property
    def cuts(self) -> tuple[int, ...]:
        """Layers at which a seam sits (the residual entering that layer crosses the network)."""
        return tuple(begin for begin, _ in self.stages[1:])

    def seam(self, k: int) -> Seam | None:
        """Shaping of seam k (between stage k and k+1); one listed seam applies to all."""
        if not self.seams:
            return None
        return self.seams[0] if len(self.seams) == 1 else self.seams[k]


@dataclass(frozen=True, kw_only=True)
class Prompts:
    set: str
    texts: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Measure:
    warmup: int
    repetitions: int
    prompt_tokens: int
    decode_tokens: int
    # Sessions decoded at the same time (pipeline.concurrency): numbers, or "n_stages" for the
    # placement's own stage count; empty: single-stream speed only.
    concurrency: tuple[int | str, ...] = ()
    concurrency_rounds: int = 3

    def concurrency_levels(self, n_stages: int) -> list[int]:
        return sorted({n_stages if c == "n_stages" else int(c) for c in self.concurrency})


@dataclass(frozen=True, kw_only=True)
class RouteChange:
    placement: str
    after_tokens: int


@dataclass(frozen=True, kw_only=True)
class Exercised:
    """What the scenario must fill of a model's compressed state, as the workers count it
    (certify/state.py): every ratio-128 layer at least ``compressed_entries_min`` compressed entries, and
    the lightning indexer selecting at most ``indexer_selected_max`` of its widest row's candidates."""

    compressed_entries_min: int
    indexer_selected_max: float


@dataclass(frozen=True, kw_only=True)
class Depth:
    """The context scenario (docs/gates.md, "Depth"): each placement's workers allocate ``context``
    positions, run one generated prompt of each length in ``prompt_tokens`` in passes of ``ubatch``
    positions (so a long prefill crosses every seam many times), then greedy-decode ``decode_tokens``.
    The judged positions are the last of every pass, spread over the whole prompt, and every decoded
    one.  The prompts come from ``seed`` alone (certify.depth_prompt): no download, same tokens on
    every host.  ``placements``: the staged placements run at depth (empty: every f32 one)."""

    context: int
    prompt_tokens: tuple[int, ...]
    ubatch: int
    decode_tokens: int
    seed: int
    placements: tuple[str, ...] = ()
    exercised: Exercised | None = None  # the state census's conditioning (state-at-depth); None: not held

    @property
    def longest(self) -> int:
        return max(self.prompt_tokens)


@dataclass(frozen=True, kw_only=True)
class PhysicalModel:
    label: str
    boundary_width: int
    sideband_bytes_per_token: int = 0


@dataclass(frozen=True, kw_only=True)
class StagingParity:
    """Limits for "staging changed nothing": a placement against the monolithic run of the same lane,
    same binary, same prompts, free-running greedy on both sides."""

    top1_agreement_min: float
    kl_mean_max: float
    kl_max_max: float
    logits_nmse_max: float
    boundary_nmse_max: float
    greedy_match_min: float


@dataclass(frozen=True, kw_only=True)
class BackendAgreement:
    """Limits for "this backend agrees with the reference": the lane's monolithic run against the CPU
    monolithic reference, teacher-forced on the reference's tokens so one flip cannot cascade.  Top-1
    is counted only on rows whose reference top-1/top-2 logit margin exceeds ``top1_margin_min``
    (near-ties are noise, not disagreement); the free-running greedy match is reported, not gated."""

    top1_margin_min: float
    top1_agreement_min: float
    kl_mean_max: float
    kl_max_max: float
    logits_nmse_max: float
    boundary_nmse_max: float


@dataclass(frozen=True, kw_only=True)
class Speed:
    decode_tok_s_min: float
    staged_mono_decode_ratio_min: float
    prefill_tok_s_min: float | None = None
    ratio_min_by_stages: Mapping[str, float] = field(default_factory=dict[str, float])
    # Shaped seams (pipeline.physics): measured against what the link allows, not against loopback.
    seam_bound_factor_max: float | None = None
    bound_efficiency_min: float | None = None

    def ratio_min(self, n_stages: int) -> float:
        """The staged/monolithic minimum for a placement of ``n_stages`` (deep layouts may relax it)."""
        best = self.staged_mono_decode_ratio_min
        floor = 0
        for key, value in self.ratio_min_by_stages.items():
            if floor < int(key) <= n_stages:
                floor, best = int(key), value
        return best


@dataclass(frozen=True, kw_only=True)
class Match:
    lanes: tuple[str, ...]
    min_cpu_cores: int | None = None
    gpu_names: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HardwareClass:
    name: str
    match: Match
    staging_parity: StagingParity
    speed: Speed
    staging_parity_f16_boundary: StagingParity | None = None
    backend_agreement: BackendAgreement | None = None
    description: str = ""

    def staging_parity_for(self, boundary_dtype: str) -> StagingParity:
        """f16 seams round the boundary on purpose, so they are held to their own declared limits."""
        if boundary_dtype == "f16" and self.staging_parity_f16_boundary is not None:
            return self.staging_parity_f16_boundary
        return self.staging_parity

    def agreement_for(self, lane: str) -> BackendAgreement | None:
        """The backend-agreement limits that apply to ``lane``: none on the CPU lane, which is the
        reference every other lane is compared with."""
        return None if lane == REFERENCE_LANE else self.backend_agreement

    def matches(self, lane: str, cpu_cores: int, gpu_names: tuple[str, ...]) -> bool:
        if lane not in self.match.lanes:
            return False
        if self.match.min_cpu_cores is not None and cpu_cores < self.match.min_cpu_cores:
            return False
        if self.match.gpu_names:
            wanted = [w.lower() for w in self.match.gpu_names]
            return any(w in g.lower() for g in gpu_names for w in wanted)
        return True


@dataclass(frozen=True, kw_only=True)
class Mtp:
    """MTP on (docs/mtp.md): the last stage drafts ``draft_tokens`` per verify pass with the nextn block.

    The block is in the main set's files (``--mtp``), or, as V4 Flash ships it, in an MTP-only file of
    its own: the set ``artifacts`` (variant ``variant``) that the last stage loads with ``--mtp-model``."""

    draft_tokens: int
    artifacts: str | None = None
    variant: str | None = None


@dataclass(frozen=True, kw_only=True)
class Recipe:
    schema_version: int
    name: str
    description: str
    artifacts: str
    variant: str
    architecture: str
    n_layer: int
    lanes: tuple[str, ...]
    placements: Mapping[str, Placement]
    prompts: Prompts
    n_decode: int
    boundary_dtype: str
    mtp: Mtp | bool  # False: off (the alpha recipes); an Mtp turns speculative decoding on explicitly
    measure: Measure
    hardware_classes: tuple[HardwareClass, ...]
    route_change: RouteChange | None = None
    physical_model: PhysicalModel | None = None
    depth: Depth | None = None  # None: the recipe certifies short contexts only
    # Identity: not part of the JSON, filled in by ``load``.
    digest: str = ""
    source: str = ""
    document: Mapping[str, Any] = field(default_factory=dict[str, Any], compare=False, repr=False)

    @property
    def most_stages(self) -> int:
        """The most stages any placement starts (all on one host, where dgr certify starts them)."""
        return max(p.n_stages for p in self.placements.values())

    @property
    def at_depth(self) -> tuple[Placement, ...]:
        """The staged placements its depth scenario runs (none without one): those it names, else every
        staged placement with f32 seams (an f16 seam's rounding is held by its own looser limits)."""
        if self.depth is None:
            return ()
        if self.depth.placements:
            return tuple(self.placements[name] for name in self.depth.placements)
        return tuple(p for p in self.staged if self.dtype_of(p) == "f32")

    @property
    def monolithic(self) -> Placement:
        return next(p for p in self.placements.values() if p.is_monolithic)

    @property
    def staged(self) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements.values() if not p.is_monolithic)

    def hardware_class(self, lane: str, cpu_cores: int, gpu_names: tuple[str, ...] = ()) -> HardwareClass:
        """The first listed class whose match rule fits this lane and machine (order is priority)."""
        for hc in self.hardware_classes:
            if hc.matches(lane, cpu_cores, gpu_names):
                return hc
        listed = ", ".join(f"{hc.name} ({'/'.join(hc.match.lanes)})" for hc in self.hardware_classes)
        raise ConfigurationError(
            f"recipe {self.name}: no hardware class matches lane {lane} on this machine "
            f"({cpu_cores} cores, GPUs: {', '.join(gpu_names) or 'none'}); listed: {listed}",
            hint=f"add a class to {self.source} (that changes the recipe digest)",
        )

    def require_lane(self, lane: str) -> None:
        """ConfigurationError unless this recipe certifies ``lane``."""
        if lane not in self.lanes:
            raise ConfigurationError(
                f"recipe {self.name} is not certified on lane {lane}",
                hint=f"its lanes: {', '.join(self.lanes)}",
            )

    def dtype_of(self, placement: Placement) -> str:
        return placement.boundary_dtype or self.boundary_dtype

    def thresholds(self) -> list[dict[str, Any]]:
        """The pre-locked gate thresholds as written in the recipe (for the certificate)."""
        return [dict(hc) for hc in self.document["hardware_classes"]]


def recipe_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where recipes are looked up: the user's folder first (``DGR_RECIPES_DIR``, else ``recipes/`` in
    the user's manifests folder: tests, private recipes, ``dgr recipe init``'s), then ours."""
    return [user_folder.recipes_dir(env), RECIPES]


def available(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    names: set[str] = set()
    for d in recipe_dirs(env):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.json") if _NAME.match(p.stem))
    return sorted(names)


def find(name: str, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if not _NAME.match(name):
        raise ConfigurationError(f"{name!r} is not a recipe name", hint="names are lower-case [a-z0-9._-]")
    for d in recipe_dirs(env):
        path = d / f"{name}.json"
        if path.is_file():
            return path
    import difflib

    known = available(env)
    close = difflib.get_close_matches(name, known, n=1)
    tip = f"did you mean {close[0]!r}?" if close else f"known recipes: {', '.join(known) or 'none'}"
    raise ConfigurationError(f"unknown recipe {name!r}", hint=tip)


def load(name: str, env: Mapping[str, str] | None = None) -> Recipe:
    """Load the recipe called ``name`` (the user's recipes folder first, then ``manifests/recipes``)."""
    path = find(name, env)
    recipe = load_file(path)
    if recipe.name != name:
        raise ConfigurationError(f"{path}: /name is {recipe.name!r} but the file is named {name}.json")
    return recipe


def load_file(path: Path) -> Recipe:
    """Load and check one recipe file (``dgr certify --recipe-file PATH``)."""
    path = Path(path)
    try:
        raw = read_json(path)  # bounded: duplicate keys, NaN/Infinity, deep nesting refused (exit 2)
    except FileNotFoundError:
        raise ConfigurationError(f"recipe file {path} does not exist") from None
    except OSError as exc:
        raise ConfigurationError(f"{path} is not readable: {exc.strerror}") from None
    # MTP gets its own sentence: it is a policy, not a typo.
    if is_json_object(raw) and raw.get("mtp") not in (None, False) and not isinstance(raw.get("mtp"), dict):
        raise ConfigurationError(
            f"{path}: at /mtp: multi-token prediction is off (false) unless the recipe turns it on "
            "explicitly with its draft length",
            hint='set "mtp": false, or {"draft_tokens": 3} for a model with a nextn block (docs/mtp.md)',
        )
    return from_document(raw, source=str(path))


def from_document(data: dict[str, Any], *, source: str) -> Recipe:
    validate(data, "recipe", source=source)
    placements = {
        key: build(Placement, {"name": key, **value}, where=f"/placements/{key}")
        for key, value in data["placements"].items()
    }
    recipe = dataclasses.replace(
        build(Recipe, {**data, "placements": {}, "mtp": False}),
        mtp=build(Mtp, data["mtp"], where="/mtp") if data["mtp"] else False,
        placements=types.MappingProxyType(placements),
        digest=canonical_digest(data),
        source=source,
        document=data,
    )
    _check(recipe)
    return recipe


def _check_nextn(recipe: Recipe) -> None:
    """MTP on needs a nextn block where the recipe says it is, the main set or the MTP-only file's set:
    its sealed header expectations say so."""
    from manifests.artifact_sets import load_set

    assert isinstance(recipe.mtp, Mtp)
    if recipe.mtp.artifacts:  # the block's own file; no variant named: that set's default
        name, variant_name = recipe.mtp.artifacts, recipe.mtp.variant
    else:
        name, variant_name = recipe.artifacts, recipe.variant
    try:
        variant = load_set(name).variant(variant_name)
    except ConfigurationError:
        return  # the artifact set itself is checked (and named) where the run provisions it
    if int(variant.gguf.kv.get(f"{recipe.architecture}.nextn_predict_layers", 0)) < 1:
        where = "/mtp/artifacts" if recipe.mtp.artifacts else "/mtp"
        raise ConfigurationError(
            f"{recipe.source}: at {where}: artifact set {name} ({variant_name or 'default variant'}) holds "
            f"no nextn block ({recipe.architecture}.nextn_predict_layers is not in its header expectations)",
            hint='set "mtp": false, or name a set with a nextn block (tiny-v4-mtp, or an MTP-only file\'s '
            'set in "mtp": {"artifacts": ...})',
        )


def _check_depth(recipe: Recipe, depth: Depth) -> None:
    """The scenario names staged placements and fits the context it allocates."""
    at = f"{recipe.source}: at /depth"
    for k, name in enumerate(depth.placements):
        placement = recipe.placements.get(name)
        if placement is None or placement.is_monolithic:
            raise ConfigurationError(f"{at}/placements/{k}: {name!r} is not a staged placement of the recipe")
    if depth.longest + depth.decode_tokens > depth.context:
        raise ConfigurationError(
            f"{at}: the longest prompt ({depth.longest}) plus {depth.decode_tokens} decoded tokens does not "
            f"fit the context of {depth.context}"
        )
    if depth.ubatch > depth.context:
        raise ConfigurationError(f"{at}/ubatch: {depth.ubatch} is larger than the context ({depth.context})")


def _untiled(at: str, gap: Break, n_layer: int) -> str:
    """Why a placement's stages do not tile the model: where they end, an empty range, or a gap."""
    if gap.stage is None:
        return f"{at}: stages end at layer {gap.end}, the model has {n_layer}"
    if gap.empty:
        return f"{at}/{gap.stage}: empty range [{gap.begin}, {gap.end})"
    return (
        f"{at}/{gap.stage}: stage starts at layer {gap.begin}, expected {gap.expected} "
        "(stages must tile the layers contiguously)"
    )


def _check(recipe: Recipe) -> None:
    """What the schema cannot say; each problem points at its key."""
    where = recipe.source
    for p in recipe.placements.values():
        at = f"{where}: at /placements/{p.name}/stages"
        gap = first_break(p.stages, recipe.n_layer)
        if gap is not None:
            raise ConfigurationError(_untiled(at, gap, recipe.n_layer))
        if p.seams and len(p.seams) not in (1, p.n_stages - 1):
            raise ConfigurationError(
                f"{where}: at /placements/{p.name}/seams: give 1 entry (every seam) or "
                f"{p.n_stages - 1} (one per seam), not {len(p.seams)}"
            )
    mono = [p.name for p in recipe.placements.values() if p.is_monolithic]
    if len(mono) != 1:
        raise ConfigurationError(
            f"{where}: at /placements: exactly one single-stage (monolithic reference) "
            f"placement is required, found {len(mono)}"
        )
    if recipe.route_change is not None:
        rc = recipe.route_change
        if rc.placement not in recipe.placements:
            raise ConfigurationError(f"{where}: at /route_change/placement: no placement {rc.placement!r}")
        if rc.after_tokens >= recipe.n_decode:
            raise ConfigurationError(
                f"{where}: at /route_change/after_tokens: must be < n_decode ({recipe.n_decode})"
            )
    if recipe.depth is not None:
        _check_depth(recipe, recipe.depth)
    if recipe.mtp:
        _check_nextn(recipe)
    _check_classes(recipe)


def _check_classes(recipe: Recipe) -> None:
    """Each hardware class: named once, its lanes the recipe's, and the limits its placements need."""
    where = recipe.source
    uses_f16 = [p.name for p in recipe.placements.values() if recipe.dtype_of(p) == "f16"]
    shaped = [p.name for p in recipe.placements.values() if p.seams]
    names = [hc.name for hc in recipe.hardware_classes]
    for k, hc in enumerate(recipe.hardware_classes):
        if names.count(hc.name) > 1:
            raise ConfigurationError(f"{where}: at /hardware_classes/{k}/name: {hc.name!r} is listed twice")
        stray = sorted(set(hc.match.lanes) - set(recipe.lanes))
        if stray:
            raise ConfigurationError(
                f"{where}: at /hardware_classes/{k}/match/lanes: {', '.join(stray)} "
                f"not in the recipe's lanes {list(recipe.lanes)}"
            )
        bound_fields = ("seam_bound_factor_max", "bound_efficiency_min")
        missing = [f for f in bound_fields if getattr(hc.speed, f) is None]
        if shaped and missing:
            raise ConfigurationError(
                f"{where}: at /hardware_classes/{k}/speed: {', '.join(missing)} missing but placement "
                f"{shaped[0]!r} has shaped seams (its speed is held to the physical bound, not to loopback)"
            )
        if uses_f16 and hc.staging_parity_f16_boundary is None:
            raise ConfigurationError(
                f"{where}: at /hardware_classes/{k}: staging_parity_f16_boundary is missing but "
                f"placement {uses_f16[0]!r} carries f16 boundaries"
            )
        others = [lane for lane in hc.match.lanes if lane != REFERENCE_LANE]
        if others and hc.backend_agreement is None:
            raise ConfigurationError(
                f"{where}: at /hardware_classes/{k}: backend_agreement is missing but lane {others[0]} is "
                f"held to the {REFERENCE_LANE} reference"
            )
