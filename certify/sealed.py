"""A sealed reference, provisioned, verified and held to the run's identity chain before any worker starts.

``load(ctx, manifest, store=...)`` provisions the reference's artifact set (``manifest`` is its sealed
artifact-set file, ``<set>.json``; its origins say where the bytes come from) into the store, hashes
the provisioned file once more against the manifest (the store's sidecar trusts a stat; a
certification reads every byte anyway) and reads it.  A changed byte anywhere is exit 3.

``check(ref, recipe, identity)`` then refuses a reference made for something else (exit 2, naming the
field): another recipe digest, another patch stack, another llama.cpp source, other artifacts, a cut
the recipe needs that the reference did not capture.  ``ref.mode_for(lane, build_key, fingerprint)``
says which gate holds the placements to it:

* the reference was made by this lane and build key: ``staging-parity`` with the recipe's staging
  thresholds (on the CPU, bitwise), and the reference's own route change is the expectation of the
  staged one (the monolithic worker doing the same switch, as in a live run);
* another lane or build key: ``backend-agreement`` (each placement teacher-forced on the reference's
  tokens, the class's backend-agreement limits); the staged route change is held to its own
  uninterrupted decode, as on any cross-lane run.

The staged/monolithic decode ratio needs the monolithic speed of *this* machine: it is carried from the
reference only when lane, build key and hardware (CPU model and cores, GPUs, machine) are the same;
otherwise that check is NOT_APPLICABLE and the certificate says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from certify import reference_file
from core.context import Context
from core.errors import ConfigurationError, IntegrityError
from manifests.recipe_model import Recipe
from pipeline import drive

if TYPE_CHECKING:
    from manifests.artifact_sets import ArtifactFile, ArtifactSet

STAGING_PARITY = "staging-parity"
BACKEND_AGREEMENT = "backend-agreement"
HARDWARE_KEYS = ("cpu_model", "cpu_cores", "machine")


@dataclass(frozen=True, kw_only=True)
class Mode:
    gate: str  # STAGING_PARITY | BACKEND_AGREEMENT
    why: str
    speed_carried: bool
    speed_reason: str  # why the staged/monolithic ratio is NOT_APPLICABLE ("" when carried)


@dataclass(frozen=True, kw_only=True)
class Sealed:
    header: Mapping[str, Any]
    trace: drive.Trace  # free-running, captures at every cut
    forced: drive.Trace | None  # teacher-forced on another reference's tokens (a lane reference)
    record: Mapping[str, Any]  # what the certificate binds: digests, set, origin, identity

    @property
    def lane(self) -> str:
        return str(self.header["lane"])

    @property
    def build_key(self) -> str | None:
        return (self.header["identity"].get("build") or {}).get("key")

    @property
    def prompts(self) -> list[list[int]]:
        return [list(p.prompt) for p in self.trace.prompts]

    @property
    def speed(self) -> dict[str, Any] | None:
        return self.header.get("speed")

    @property
    def route(self) -> drive.RouteChange | None:
        rc = self.header.get("route_change")
        if not rc:
            return None
        return drive.RouteChange(
            reference=tuple(rc["reference"]),
            switched=tuple(rc["switched"]),
            switch_at=int(rc["switch_at"]),
            reprefill_tokens=int(rc["reprefill_tokens"]),
            cache_miss=str(rc["cache_miss"]),
        )

    @property
    def threads(self) -> list[int]:
        """The thread counts its workers ran at (their Info's; one count for a reference dgr made)."""
        return [int(t) for t in self.header.get("threads") or []]

    def mode_for(
        self, lane: str, build_key: str | None, fingerprint: Mapping[str, Any], threads: int | None = None
    ) -> Mode:
        """``threads``: this run's workers' count, named in ``why`` where it differs from the reference's."""
        made = f"made on lane {self.lane} by build {str(self.build_key)[:16]}…"
        if lane == self.lane and build_key is not None and build_key == self.build_key:
            same_hw, differs = same_hardware(self.header.get("hardware") or {}, fingerprint)
            return Mode(
                gate=STAGING_PARITY,
                why=f"the sealed reference was {made}, as this run: staging parity, the recipe's thresholds"
                + self._other_threads(threads),
                speed_carried=same_hw and self.speed is not None,
                speed_reason=""
                if same_hw
                else (
                    f"the sealed reference's monolithic speed was measured on other hardware ({differs}); "
                    "a ratio to it says nothing about this machine"
                ),
            )
        this = f"lane {lane}, build " + (f"{build_key[:16]}…" if build_key else "not known here")
        return Mode(
            gate=BACKEND_AGREEMENT,
            why=f"the sealed reference was {made}; this run is {this}: the backend-agreement gate applies "
            "(each placement teacher-forced on the reference's tokens)",
            speed_carried=False,
            speed_reason=f"the sealed reference's monolithic speed is another lane's or build's ({made})",
        )

    def _other_threads(self, threads: int | None) -> str:
        """Why parity may miss though lane and build match: ggml's results can depend on the thread
        count (tiny-v4's logits differ between 1 thread and 2; worker/README.md, "Threads")."""
        if threads is None or not self.threads or self.threads == [threads]:
            return ""
        theirs = ", ".join(map(str, self.threads))
        return (
            f"; its workers ran at {theirs} threads and this run's at {threads}: where ggml's results "
            f"depend on the count, parity can miss (DGR_WORKER_THREADS={self.threads[0]} runs at the "
            "reference's)"
        )


def same_hardware(made: Mapping[str, Any], here: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether two fingerprints name the same hardware (not the kernel or Python); and what differs."""
    differs = [f"{k} {made.get(k)!r} vs {here.get(k)!r}" for k in HARDWARE_KEYS if made.get(k) != here.get(k)]
    gpus_made = sorted(str(g.get("name")) for g in made.get("gpus", []))
    gpus_here = sorted(str(g.get("name")) for g in here.get("gpus", []))
    if gpus_made != gpus_here:
        differs.append(f"gpus {gpus_made} vs {gpus_here}")
    return not differs, "; ".join(differs)


def load(ctx: Context, manifest: Path, *, store: Path | None) -> Sealed:
    """Provision the sealed reference named by its artifact-set manifest, verify every byte, read it."""
    manifest = Path(manifest)
    if not manifest.is_file():
        raise ConfigurationError(
            f"sealed reference manifest {manifest} does not exist",
            hint="make one with `dgr reference --recipe R --lane L`",
        )
    aset, entry, path = _provision_verified(ctx, manifest, store)
    contents = reference_file.read(path)
    header = contents.header
    record = _record(manifest, aset, entry, path, header)
    return Sealed(
        header=header,
        trace=_trace(header, contents.tensors, "free"),
        forced=_trace(header, contents.tensors, "forced") if header.get("forced") else None,
        record=record,
    )


def _provision_verified(
    ctx: Context, manifest: Path, store: Path | None
) -> tuple[ArtifactSet, ArtifactFile, Path]:
    """The reference's one file provisioned into the store and hashed once more against the manifest:
    the store's sidecar trusts a stat, and a certification reads every byte anyway (exit 3 on any
    difference)."""
    from core.hashing import digest_file
    from fetch.provision import provision
    from manifests.artifact_sets import load_set

    name, root = manifest.stem, manifest.parent
    aset = load_set(name, root=root)
    provisioned = provision(ctx, name, store=store, manifests=root)
    if len(provisioned.files) != 1:
        raise IntegrityError(f"sealed reference {name}: {len(provisioned.files)} files, a reference has one")
    path = Path(provisioned.files[0])
    entry = aset.variant(provisioned.variant).files[0]
    d = digest_file(path, sha256=True, blake3=True)
    if d.sha256 != entry.sha256 or d.blake3 != entry.blake3:
        raise IntegrityError(
            f"sealed reference {name}: {path} does not match its manifest (sha256 {d.sha256}, "
            f"manifest {entry.sha256}); not used",
            hint="the store copy was changed: remove it and provision again from the reference's origin",
        )
    return aset, entry, path


def _record(
    manifest: Path, aset: ArtifactSet, entry: ArtifactFile, path: Path, header: Mapping[str, Any]
) -> dict[str, Any]:
    """What a certificate binds of the reference: its set, manifest, digests, origins and where it
    lies, and the identity and hardware it was made with (``Sealed.record``)."""
    return {
        "set": manifest.stem,
        "manifest": str(manifest.resolve()),
        "manifest_digest": aset.digest,
        "file": entry.name,
        "sha256": entry.sha256,
        "blake3": entry.blake3,
        "size": entry.size,
        "origins": [o.path or o.base_url or o.kind for o in aset.origins],
        "store_path": str(path.resolve()),
        "lane": header["lane"],
        "made": header.get("made"),
        "made_run_id": header.get("run_id"),
        "identity": header["identity"],
        "hardware": header.get("hardware"),
        "format": f"{reference_file.ARCH} v{reference_file.FORMAT_VERSION}",
    }


def _trace(header: Mapping[str, Any], tensors: Mapping[str, np.ndarray], prefix: str) -> drive.Trace:
    """A stored trace as the driver's Trace: logits, captures and tokens; the timings are not stored
    (NaN: a sealed reference's speed lives in its speed figures, measured where it was made)."""
    cuts = [int(c) for c in header["cuts"]]
    untimed = drive.Step(
        n_tokens=0, wall_seconds=math.nan, stage_wall=(), stage_compute=(), seam_bytes=(), seam_seconds=()
    )
    prompts = []
    for i, p in enumerate(header[prefix]["prompts"]):
        prompts.append(
            drive.PromptTrace(
                prompt=tuple(int(t) for t in p["prompt"]),
                tokens=tuple(int(t) for t in p["tokens"]),
                logit_positions=tuple(int(t) for t in p["logit_positions"]),
                logits=tensors[f"{prefix}.p{i}.logits"],
                boundaries={},
                captures={c: tensors[f"{prefix}.p{i}.capture.{c}"] for c in cuts},
                prefill=untimed,
                decode=(),
            )
        )
    n_layer = int(header["n_layer"])
    return drive.Trace(
        placement=((0, n_layer),), cuts=(), boundary_dtype="f32", infos=(), prompts=tuple(prompts)
    )


def _refuse(ref: Sealed, recipe: Recipe, what: str, theirs: Any, ours: Any) -> ConfigurationError:
    return ConfigurationError(
        f"sealed reference {ref.record['set']} was made with another {what}: {_short(theirs)}, "
        f"this run has {_short(ours)}",
        hint=f"make a reference for this run: `dgr reference --recipe {recipe.name} --lane LANE`",
    )


def check_recipe(ref: Sealed, recipe: Recipe) -> None:
    """Exit 2 unless the reference was made with this very recipe (its digest: prompts, decode length,
    placements and thresholds); cheap, so it runs before anything is provisioned or built."""
    h = ref.header
    if h["recipe"]["digest"] != recipe.digest:
        raise _refuse(
            ref, recipe, f"recipe digest (recipe {h['recipe']['name']})", h["recipe"]["digest"], recipe.digest
        )


def check(ref: Sealed, recipe: Recipe, identity: Mapping[str, Any], cuts: Sequence[int]) -> None:
    """Exit 2 naming the first field where the reference was made for something else than this run."""
    h, made = ref.header, ref.header["identity"]

    def refuse(what: str, theirs: Any, ours: Any) -> None:
        raise _refuse(ref, recipe, what, theirs, ours)

    check_recipe(ref, recipe)
    ours_patch = (identity.get("patches") or {}).get("digest")
    if made["patches"]["digest"] != ours_patch:
        refuse("patch digest", made["patches"]["digest"], ours_patch)
    src = identity.get("source") or {}
    for key in ("commit", "tree"):
        if made["source"].get(key) != src.get(key):
            refuse(f"llama.cpp source {key}", made["source"].get(key), src.get(key))
    art = identity.get("artifacts") or {}
    for key in ("set", "variant", "manifest_digest"):
        if made["artifacts"].get(key) != art.get(key):
            refuse(f"artifact {key}", made["artifacts"].get(key), art.get(key))
    missing = sorted(set(cuts) - {int(c) for c in h["cuts"]})
    if missing:
        need = ", ".join(map(str, missing))
        refuse(f"set of captured cuts (this recipe's placements need layer {need})", h["cuts"], sorted(cuts))


def _short(value: Any) -> str:
    s = str(value)
    return s[:16] + "…" if len(s) == 64 and all(c in "0123456789abcdef" for c in s) else s
