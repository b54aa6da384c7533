"""Check a certificate: envelope, payload type, signature against trusted keys, statement, every
digest that can be recomputed here (artifact files, worker binaries, the HTML report).

Each problem is one line with one specific reason; what could not be checked is said, not hidden.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certify import certificate as cert
from certify.keys import TrustedKey
from core.canonical import BadSignedJson, parse_json, sha256_file
from core.errors import ConfigurationError

OK, FAIL, SKIP, WARN = "ok", "FAIL", "skip", "warn"


@dataclass(frozen=True, kw_only=True)
class Line:
    status: str
    what: str
    detail: str

    def text(self) -> str:
        return f"{self.status:<4} {self.what}: {self.detail}"


@dataclass(kw_only=True)
class Verification:
    path: Path
    lines: list[Line] = field(default_factory=list)
    statement: dict[str, Any] | None = None
    signer: TrustedKey | None = None

    def add(self, status: str, what: str, detail: str) -> None:
        self.lines.append(Line(status=status, what=what, detail=detail))

    @property
    def failures(self) -> list[Line]:
        return [ln for ln in self.lines if ln.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def catalog(self) -> bool:
        """A catalog (certify/catalog.py) rather than a certificate."""
        return (self.statement or {}).get("predicateType") == cert.CATALOG_TYPE

    @property
    def roster(self) -> bool:
        """A roster (certify/roster.py) rather than a certificate."""
        return (self.statement or {}).get("predicateType") == cert.ROSTER_TYPE

    @property
    def predicate(self) -> Mapping[str, Any]:
        pred = (self.statement or {}).get("predicate")
        return pred if isinstance(pred, dict) else {}


def verify(
    path: Path,
    keys: Mapping[str, TrustedKey],
    *,
    html: Path | None = None,
    store: Path | None = None,
    store_only: bool = False,
    subjects: bool = True,
) -> Verification:
    """``subjects=False`` skips re-hashing artifact files (the report index only needs signature + HTML).
    ``store_only``: artifact files are looked up under ``store`` only (`dgr verify --store DIR`), never
    at the paths the certificate recorded."""
    path = Path(path)
    v = Verification(path=path)
    envelope = cert.read_envelope(path)  # a file that is not an envelope at all stops here
    if envelope["payloadType"] != cert.PAYLOAD_TYPE:
        v.add(FAIL, "payloadType", f"is {envelope['payloadType']!r}, expected {cert.PAYLOAD_TYPE!r}")
    else:
        v.add(OK, "payloadType", cert.PAYLOAD_TYPE)
    payload = cert.b64decode(envelope["payload"], "the envelope payload")
    _check_signature(v, envelope, payload, keys)
    try:
        stmt = parse_json(payload, source="the signed payload", signed=True)
    except BadSignedJson as exc:
        v.add(FAIL, "statement", exc.message)
        return v
    if not isinstance(stmt, dict):
        v.add(FAIL, "statement", "payload is not a JSON object")
        return v
    v.statement = stmt
    if not _check_statement(v, stmt):
        return v
    _check_signer_binding(v)
    if subjects:
        _check_subjects(v, stmt, store, store_only=store_only)
    else:
        v.add(SKIP, "subjects", "digests not recomputed (use `dgr verify` for that)")
    if v.roster:
        _check_table(v, html)
    elif not v.catalog:  # a catalog has no page of its own
        _check_html(v, html)
    return v


def _check_signature(
    v: Verification, envelope: Mapping[str, Any], payload: bytes, keys: Mapping[str, TrustedKey]
) -> None:
    message = cert.pae(envelope["payloadType"], payload)
    # keyid is an unsigned hint: anything but a string (a crafted list, a number) names no key.
    named = [k if isinstance(k := s.get("keyid"), str) else "" for s in envelope["signatures"]]
    for s, hint in zip(envelope["signatures"], named, strict=True):
        sig = cert.b64decode(s["sig"], "a signature")
        # keyid is only a hint in DSSE: try the named key first, then every other trusted key.
        candidates = sorted(keys.values(), key=lambda k: k.keyid != hint)
        for key in candidates:
            if key.verifies(sig, message):
                v.signer = key
                v.add(OK, "signature", f"Ed25519, key {key.keyid[:16]}… from {key.source}")
                if key.dev_key:
                    v.add(WARN, "signing key", "dev key, not trusted for publication")
                return
    trusted_named = [k for k in named if k in keys]
    if trusted_named:
        v.add(
            FAIL,
            "signature",
            f"does not verify with trusted key {trusted_named[0][:16]}…: "
            "the payload or the signature was changed after signing",
        )
    else:
        v.add(
            FAIL,
            "signature",
            f"signed by key {(named[0] or 'unnamed')[:16]}…, which is not trusted "
            "(add its public key to manifests/keys/ or pass --key PEM)",
        )


def _check_statement(v: Verification, stmt: Mapping[str, Any]) -> bool:
    if stmt.get("_type") != cert.STATEMENT_TYPE:
        v.add(FAIL, "statement type", f"is {stmt.get('_type')!r}, expected {cert.STATEMENT_TYPE!r}")
        return False
    if stmt.get("predicateType") == cert.CATALOG_TYPE:
        return _check_catalog(v, stmt)
    if stmt.get("predicateType") == cert.ROSTER_TYPE:
        return _check_roster(v, stmt)
    if stmt.get("predicateType") != cert.PREDICATE_TYPE:
        v.add(FAIL, "predicateType", f"is {stmt.get('predicateType')!r}, expected {cert.PREDICATE_TYPE!r}")
        return False
    pred = stmt.get("predicate")
    if isinstance(pred, dict) and pred.get("schema_version") not in cert.READABLE_PREDICATE_VERSIONS:
        v.add(
            FAIL,
            "predicate",
            f"schema_version {pred.get('schema_version')!r} is not supported "
            f"(this dgr reads {', '.join(map(str, cert.READABLE_PREDICATE_VERSIONS))})",
        )
        return False
    subjects = _held(v, stmt, "certificate-predicate", "predicate", none="the statement names no subject")
    if subjects is None:
        return False
    assert isinstance(pred, dict)  # the predicate's schema holds it to an object
    v.add(
        OK,
        "statement",
        f"in-toto Statement v1, {len(subjects)} subjects, verdict {pred['verdict']['status']}",
    )
    return True


def _predicate_of(v: Verification, stmt: Mapping[str, Any], kind: str, supported: int) -> dict | None:
    """A signed document's predicate when its schema version is the one this dgr reads; else None, said."""
    pred = stmt.get("predicate")
    if isinstance(pred, dict) and pred.get("schema_version") == supported:
        return pred
    got = pred.get("schema_version") if isinstance(pred, dict) else None
    v.add(FAIL, kind, f"schema_version {got!r} is not supported (this dgr reads {supported})")
    return None


def _check_catalog(v: Verification, stmt: Mapping[str, Any]) -> bool:
    """A catalog's statement: its schema, and at least one certificate it was made from."""
    pred = _predicate_of(v, stmt, "catalog", cert.CATALOG_SCHEMA_VERSION)
    if pred is None:
        return False
    subjects = _held(v, stmt, "catalog", "catalog", none="the catalog names no certificate")
    if subjects is None:
        return False
    v.add(
        OK,
        "statement",
        f"in-toto Statement v1, catalog of {len(pred['entries'])} certified placements and "
        f"{len(pred['failures'])} failures from {len(subjects)} certificates",
    )
    return True


def _check_roster(v: Verification, stmt: Mapping[str, Any]) -> bool:
    """A roster's statement: its schema, and at least one subject (the worker it staged with)."""
    pred = _predicate_of(v, stmt, "roster", cert.ROSTER_SCHEMA_VERSION)
    if pred is None:
        return False
    subjects = _held(v, stmt, "roster", "roster", none="the roster names no subject")
    if subjects is None:
        return False
    s = pred["summary"]
    v.add(
        OK,
        "statement",
        f"in-toto Statement v1, roster: {s['staged_bitwise']} of {s['generated']} generated architectures "
        f"staged bitwise, {s['failed']} failed, {len(subjects)} subjects",
    )
    return True


def _held(v: Verification, stmt: Mapping[str, Any], schema: str, what: str, *, none: str) -> list[Any] | None:
    """The statement's subjects once its predicate is what ``schema`` says and it names at least one
    (None after a FAIL line saying which)."""
    from manifests.loader import validate

    try:
        validate(stmt.get("predicate"), schema, source=f"the {what}")
    except ConfigurationError as exc:
        v.add(FAIL, what, exc.message)
        return None
    subjects = stmt.get("subject")
    if not isinstance(subjects, list) or not subjects:
        v.add(FAIL, "subjects", none)
        return None
    return subjects


def _check_signer_binding(v: Verification) -> None:
    signer = v.predicate.get("signer")
    named = signer.get("keyid") if isinstance(signer, dict) else None
    if v.signer is not None and named != v.signer.keyid:
        v.add(
            FAIL,
            "signer",
            f"the predicate names key {str(named)[:16]}… but the signature is by {v.signer.keyid[:16]}…",
        )
    elif isinstance(signer, dict) and signer.get("dev_key"):
        v.add(WARN, "signer", "the certificate says it was signed with a workspace dev key")


def _locate(name: str, local: Mapping[str, Any], store: Path | None, *, store_only: bool) -> Path | None:
    """The file to hash for subject ``name``: under ``store`` only when the caller named a store
    (the store given is the one checked), else the path recorded at certification, then ``store``."""
    recorded = local.get(name)
    if not store_only and isinstance(recorded, str) and recorded and Path(recorded).is_file():
        return Path(recorded)
    if store is not None and name.startswith("artifacts/"):
        candidate = store / name.removeprefix("artifacts/")
        if candidate.is_file():
            return candidate
    return None


def _check_subjects(
    v: Verification, stmt: Mapping[str, Any], store: Path | None, *, store_only: bool
) -> None:
    local = v.predicate.get("local_paths")
    local = local if isinstance(local, dict) else {}
    for i, s in enumerate(stmt["subject"]):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            v.add(FAIL, f"subject {i}", "is not an object with a string name")
            continue
        name = s["name"]
        expected = s.get("digest")
        if not isinstance(expected, dict) or not isinstance(expected.get("sha256"), str):
            v.add(FAIL, f"subject {name}", "carries no sha256 digest")
            continue
        found = _locate(name, local, store, store_only=store_only)
        if found is None:
            where = f"in store {store}" if store_only else "here"
            how = cert.established(s).get("sha256")
            signed = f" (the certificate says its sha256 is {how})" if how and how != cert.HASHED_NOW else ""
            v.add(SKIP, f"subject {name}", f"file not present {where}; digest not recomputed{signed}")
            continue
        actual = cert.file_digests(found)
        bad = [alg for alg in ("sha256", "blake3") if alg in expected and expected[alg] != actual[alg]]
        if bad:
            alg = bad[0]
            v.add(
                FAIL,
                f"subject {name}",
                f"{alg} mismatch for {found}: certificate says {expected[alg]}, file has {actual[alg]}",
            )
        else:
            v.add(OK, f"subject {name}", f"{' + '.join(sorted(expected))} match {found}")


def _check_table(v: Verification, page: Path | None) -> None:
    """A roster's Markdown page (beside it, or ``page``) against the digest it signed."""
    table = v.predicate["table"]
    target = Path(page) if page is not None else v.path.parent / str(table["file"])
    if not target.is_file():
        v.add(SKIP, "roster table", f"{target} not present; its digest was not checked")
    elif (actual := sha256_file(target)) != table["sha256"]:
        edited = "the page was edited or is another run's"
        v.add(
            FAIL,
            "roster table",
            f"{target} does not match: sha256 {actual}, signed {table['sha256']} ({edited})",
        )
    else:
        v.add(OK, "roster table", f"sha256 matches {target}")


def _check_html(v: Verification, html: Path | None) -> None:
    report = v.predicate.get("report")
    report = report if isinstance(report, dict) else {}
    expected = report.get("html_sha256")
    target = Path(html) if html is not None else v.path.parent / str(report.get("file", "report.html"))
    if not target.is_file():
        v.add(SKIP, "report HTML", f"{target} not present; its digest was not checked")
        return
    actual = sha256_file(target)
    if actual != expected:
        v.add(
            FAIL,
            "report HTML",
            f"{target} does not match the certificate: sha256 {actual}, "
            f"certificate says {expected} (the page was edited or belongs to another run)",
        )
    else:
        v.add(OK, "report HTML", f"sha256 matches {target}")
