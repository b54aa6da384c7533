"""The catalog: what is certified, in one signed document a router or an admission check reads.

A certificate speaks for one run of one recipe; a router asks another question: which placements of
which model, on which lane and hardware class, are certified now, and what each stage holds and
costs.  The catalog answers it from the certificates alone: each is verified (signature, statement,
its report's digest), each placement under test becomes an entry with the exact identity it was
certified with, its stages' bytes and seconds, its seams' cost against their bound and its speed.
The newest PASS per (lane, recipe, hardware class, placement) is kept; every FAIL is listed with its
reasons; a certificate that does not verify is listed as refused, never read.

The catalog is signed like a certificate: an in-toto Statement of its own predicate type whose
subjects are the certificates it read, in a DSSE envelope; `dgr verify` checks it
(certificate.CATALOG_TYPE names its schema, manifests/schemas/catalog.schema.json).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certify import certificate as cert
from certify.gates import STAGING_PARITY  # the gate whose PASS certifies a placement (docs/gates.md)
from certify.keys import SigningKey, TrustedKey
from certify.verify import verify
from core.errors import ConfigurationError, IntegrityError

CERTIFICATE = "certificate.json"
FAILED = ("FAIL", "ERROR")  # a gate's statuses that fail its placement


@dataclass(frozen=True, kw_only=True)
class Read:
    """One certificate that verified: where it is, its digests and what it says."""

    path: Path
    digests: Mapping[str, str]  # sha256, blake3 of the envelope file
    predicate: Mapping[str, Any]

    @property
    def subject(self) -> str:
        return f"certificates/{self.predicate['run_id']}"


def certificate_paths(paths: Iterable[Path]) -> list[Path]:
    """The certificates named, a folder standing for every certificate.json under it (sorted)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob(CERTIFICATE) if p.is_file() and not p.is_symlink())
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigurationError(f"{path}: no such certificate or folder")
    return found


def read_all(
    paths: Sequence[Path], keys: Mapping[str, TrustedKey]
) -> tuple[list[Read], list[dict[str, str]]]:
    """The certificates that verify (signature, statement, report digest), and those refused with the
    first reason; artifact digests are not recomputed here (`dgr verify --store` does that)."""
    read: dict[str, Read] = {}  # run id -> what its certificate says
    refused: list[dict[str, str]] = []
    for path in paths:
        try:
            v = verify(path, keys, subjects=False)
        except IntegrityError as exc:
            refused.append({"path": str(path), "reason": exc.message})
            continue
        if not v.ok:
            first = v.failures[0]
            refused.append({"path": str(path), "reason": f"{first.what}: {first.detail}"})
            continue
        if v.predicate.get("schema_version") != cert.PREDICATE_SCHEMA_VERSION:
            refused.append({"path": str(path), "reason": _older_schema(v.predicate)})
            continue
        got = Read(path=path, digests=cert.file_digests(path), predicate=v.predicate)
        run_id = str(v.predicate.get("run_id"))
        same = read.get(run_id)
        if same is None:
            read[run_id] = got
        elif same.digests["sha256"] != got.digests["sha256"]:  # a copy of the same file is read once
            refused.append(
                {"path": str(path), "reason": f"another certificate of run {same.subject} was read"}
            )
    return list(read.values()), refused


def _older_schema(pred: Mapping[str, Any]) -> str:
    """Why a certificate `dgr verify` still reads is not catalogued: a schema 1 certificate holds one
    parity claim per placement, before it was split into staging parity (what certifies a placement
    here) and backend agreement, so its placements cannot be said certified in today's terms."""
    return (
        f"schema_version {pred.get('schema_version')!r}: its results predate the {STAGING_PARITY} gate "
        f"that certifies a placement here (schema {cert.PREDICATE_SCHEMA_VERSION}); certify it again"
    )


def entries(read: Read) -> list[dict[str, Any]]:
    """One entry per placement the certificate held under test (the monolithic reference is not one)."""
    pred = read.predicate
    placements = (pred.get("figures") or {}).get("placements") or []
    return [_entry(read, p) for p in placements if p.get("role") == "under test"]


def _entry(read: Read, placement: Mapping[str, Any]) -> dict[str, Any]:
    pred = read.predicate
    status, reasons = placement_status(pred, placement["name"])
    recipe = pred.get("recipe") or {}
    speed = placement.get("speed") or {}
    return {
        "lane": pred.get("lane"),
        "recipe": recipe.get("name"),
        "hardware_class": recipe.get("hardware_class"),
        "placement": placement["name"],
        "status": status,
        "reasons": reasons,
        "identity": identity(pred),
        "forwarding": placement.get("forwarding", "relayed"),
        "boundary_dtype": placement.get("boundary_dtype"),
        "stages": stages(placement),
        "seams": seams(placement),
        "speed": {
            "decode_tok_s": _median(speed.get("decode_tok_s")),
            "prefill_tok_s": _median(speed.get("prefill_tok_s")),
        },
        "route_change": route_change(pred, placement["name"]),
        "certificate": {
            "subject": read.subject,
            "sha256": read.digests["sha256"],
            "run_id": pred.get("run_id"),
            "finished": pred.get("finished"),
            "verdict": (pred.get("verdict") or {}).get("status"),
        },
    }


def placement_status(pred: Mapping[str, Any], name: str) -> tuple[str, list[str]]:
    """PASS when the certificate passed, the placement's staging-parity gate passed (the gate that
    certifies a placement: a SKIPPED one ran nothing) and none of its own gates failed; otherwise FAIL
    with the reasons (its own gates', or the certificate's when another part of the run failed)."""
    own = {r["name"]: r for r in pred.get("results") or [] if _placement_of(r) == name}
    failed = [f"{n}: {r.get('reason') or r['status']}" for n, r in own.items() if r.get("status") in FAILED]
    verdict = pred.get("verdict") or {}
    if failed:
        return "FAIL", failed
    if verdict.get("status") != "PASS":
        why = "; ".join(verdict.get("reasons") or []) or str(verdict.get("status"))
        return "FAIL", [f"the certificate's verdict is {verdict.get('status')}: {why}"]
    parity = own.get(f"{STAGING_PARITY}/{name}") or {}
    if parity.get("status") != "PASS":
        return "FAIL", [f"{STAGING_PARITY}/{name} is {parity.get('status', 'absent')}: not compared"]
    return "PASS", []


def _placement_of(result: Mapping[str, Any]) -> str:
    """A result names its placement after the slash: staging-parity/two-middle, speed/two-middle."""
    return str(result.get("name", "")).split("/", 1)[-1]


def identity(pred: Mapping[str, Any]) -> dict[str, Any]:
    """What must match exactly for a run to be the one certified (the router's compatibility key)."""
    ident = pred.get("identity") or {}
    art = ident.get("artifacts") or {}
    mtp = ident.get("mtp_artifacts") or None
    build = ident.get("build") or {}
    return {
        "recipe_digest": (pred.get("recipe") or {}).get("digest"),
        "artifacts": {k: art.get(k) for k in ("set", "variant", "manifest_digest")},
        "mtp_artifacts": {k: mtp.get(k) for k in ("set", "variant", "manifest_digest")} if mtp else None,
        "patch_stack": (ident.get("patches") or {}).get("digest"),
        "worker_source": (build.get("key_inputs") or {}).get("worker"),
        "build_key": build.get("key"),
        "llama_commit": (ident.get("source") or {}).get("commit"),
    }


def stages(placement: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per stage: its layers, the bytes it holds and the compute seconds a decoded token costs it."""
    ranges = placement.get("stages") or []
    n = len(ranges)
    weight = _per_stage(placement.get("weight_bytes"), n)
    kv = _per_stage(placement.get("kv_bytes"), n)
    n_ctx = _per_stage(placement.get("n_ctx"), n)
    compute = _per_stage((placement.get("speed") or {}).get("stage_compute_s"), n)
    held = _per_stage(placement.get("kv_held"), n)
    out = []
    for k in range(n):
        allocated = kv[k] / n_ctx[k] if kv[k] is not None and n_ctx[k] else None
        measured = held_per_position(held[k])
        out.append(
            {
                "layers": list(ranges[k]),
                "weight_bytes": weight[k],
                "kv_bytes": kv[k],
                "n_ctx": n_ctx[k],
                **_kv_per_token(measured, allocated),
                "compute_s_per_token": compute[k],
            }
        )
    return out


def _kv_per_token(measured: tuple[float, tuple[int, int]] | None, allocated: float | None) -> dict[str, Any]:
    """A stage's KV bytes per token: measured from what it held where it was, else its allocation."""
    if measured:
        return {
            "kv_bytes_per_token": measured[0],
            "kv_bytes_per_token_from": "held",
            "kv_held_between": list(measured[1]),
        }
    source = "allocated" if allocated is not None else None
    return {"kv_bytes_per_token": allocated, "kv_bytes_per_token_from": source, "kv_held_between": None}


def held_per_position(points: Any) -> tuple[float, tuple[int, int]] | None:
    """Bytes a session's state grew by per position, between the fewest and the most positions a stage
    held ([positions, state bytes] pairs, measure's kv_held), and those two counts; None without two
    different counts.  A plain attention cache grows by the same bytes every position; a sliding
    window or a compressed cache (gemma3, DeepSeek V4) does not, so the span it was measured over is
    part of the figure."""
    pairs = sorted({(int(n), int(b)) for n, b in points or ()})
    if len(pairs) < 2 or pairs[0][0] == pairs[-1][0]:
        return None
    (n0, b0), (n1, b1) = pairs[0], pairs[-1]
    return (b1 - b0) / (n1 - n0), (n0, n1)


def seams(placement: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per seam: the bytes a token sends across it and what crossing it cost against its bound."""
    model = placement.get("seam_model") or {}
    return [
        {
            "after_stage": s.get("seam"),
            "cut": s.get("cut"),
            "bytes_per_token": s.get("bytes_per_token"),
            "measured_s": s.get("measured_s"),
            "bound_s": s.get("bound_s"),
            "ratio": s.get("ratio"),
        }
        for s in model.get("seams") or []
    ]


def route_change(pred: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """What re-prefilling after a route change cost on this placement, at the deepest context measured
    (the depth scenario's switch when it ran on this placement, else the short one's)."""
    figures = pred.get("figures") or {}
    found = None
    for rc in (figures.get("route_change"), (figures.get("depth") or {}).get("route_change")):
        if isinstance(rc, Mapping) and rc.get("placement") == name and rc.get("reprefill_s") is not None:
            found = {k: rc.get(k) for k in ("reprefill_s", "reprefill_tokens", "prefix_tokens")}
    return found


def build(
    read: Sequence[Read], refused: Sequence[Mapping[str, str]], *, made: str | None = None
) -> dict[str, Any]:
    """The catalog's predicate: the newest PASS per key, every FAIL, every certificate refused."""
    every = [e for r in read for e in entries(r)]
    newest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in every:
        if e["status"] != "PASS":
            continue
        key = (e["lane"], e["recipe"], e["hardware_class"], e["placement"])
        if key not in newest or str(e["certificate"]["finished"]) > str(
            newest[key]["certificate"]["finished"]
        ):
            newest[key] = e
    failures = [e for e in every if e["status"] != "PASS"]
    return {
        "schema_version": cert.CATALOG_SCHEMA_VERSION,
        "made": made or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "entries": sorted(newest.values(), key=_order),
        "failures": sorted(failures, key=_order),
        "refused": list(refused),
        "local_paths": {r.subject: str(r.path.resolve()) for r in read},
    }


def sign(catalog: Mapping[str, Any], read: Sequence[Read], key: SigningKey) -> dict[str, Any]:
    """The signed envelope: each certificate read is a subject, digests hashed over its file now."""
    subjects = [cert.subject(r.subject, r.digests) for r in read]
    predicate = {**catalog, "signer": {"keyid": key.keyid, "dev_key": key.dev_key}}
    return cert.sign(cert.statement(subjects, predicate, predicate_type=cert.CATALOG_TYPE), key)


def _order(e: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(e[k]) for k in ("lane", "recipe", "hardware_class", "placement")) + (
        str(e["certificate"]["finished"]),
    )


def _finished(e: Mapping[str, Any]) -> str:
    return str(e["certificate"]["finished"])  # ISO 8601 UTC: text order is time order


def _median(stat: Any) -> float | None:
    return stat.get("median") if isinstance(stat, Mapping) else None


def _per_stage(values: Any, n: int) -> list[Any]:
    return list(values) if isinstance(values, list) and len(values) == n else [None] * n
