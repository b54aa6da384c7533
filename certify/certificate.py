"""The certificate: an in-toto Statement v1 inside a DSSE envelope, signed with Ed25519.

DSSE signs PAE(payloadType, payload), never the JSON text around it, so the envelope can be
re-serialised freely while the payload bytes stay exactly what was signed.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from certify.keys import SigningKey
from core.canonical import canonical_bytes, read_json, write_json
from core.errors import IntegrityError
from core.hashing import digest_file

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# A type URI in the project's own namespace; it names a schema, nothing is fetched from it.
PREDICATE_TYPE = "https://dgr-certify/certification/v1"
CATALOG_TYPE = "https://dgr-certify/catalog/v1"  # certify/catalog.py: what is certified, signed the same way
CATALOG_SCHEMA_VERSION = 1
# certify/roster.py: which architectures stage (dgr roster), signed the same way
ROSTER_TYPE = "https://dgr-certify/roster/v1"
ROSTER_SCHEMA_VERSION = 1
PREDICATE_SCHEMA_VERSION = 2  # 2: the parity claim split into the staging-parity and backend-agreement gates
READABLE_PREDICATE_VERSIONS = (1, 2)  # verify still reads the certificates made before the split
# We sign with one key; DSSE allows several (a key rotation signs with both), not thousands: each one is
# tried against every trusted key, so 250,000 bogus ones once cost minutes of CPU before exit 3.
MAX_SIGNATURES = 16


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def file_digests(path: Path) -> dict[str, str]:
    """sha256 and blake3 of a file in one read (core.hashing: multi-threaded blake3, sha256 beside it)."""
    d = digest_file(path, sha256=True, blake3=True)
    assert d.sha256 is not None and d.blake3 is not None
    return {"sha256": d.sha256, "blake3": d.blake3}


# How a subject's digest was established (in-toto ResourceDescriptor annotations, signed with the digest):
# a certificate never states a digest without saying whether it was computed over that file.
ESTABLISHED = "digest_established"
HASHED_NOW = "hashed over this file when the certificate was made"
PROVISIONING_BLAKE3 = (
    "checked over this file by provisioning against the sealed manifest (chunk digests as it landed, then "
    "the whole-file blake3), or trusted from the store's record of that check while the file's size, mtime "
    "and inode are unchanged"
)
MANIFEST_SHA256 = (
    "the sealed manifest's sha256 for this file (sealed from the same bytes as its blake3), not recomputed "
    "by this run; `dgr verify` recomputes it"
)


def subject(
    name: str, digests: Mapping[str, str], *, established: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A statement subject; ``established``: per digest, how it was established (default: hashed now)."""
    digest = {k: digests[k] for k in ("sha256", "blake3") if k in digests}
    how = {k: (established or {}).get(k, HASHED_NOW) for k in digest}
    return {"name": name, "digest": digest, "annotations": {ESTABLISHED: how}}


def established(s: Mapping[str, Any]) -> dict[str, str]:
    """How a subject says its digests were established ({} in certificates made before they said it)."""
    notes = s.get("annotations")
    how = notes.get(ESTABLISHED) if isinstance(notes, Mapping) else None
    return {k: v for k, v in how.items() if isinstance(v, str)} if isinstance(how, Mapping) else {}


def statement(
    subjects: Sequence[Mapping[str, Any]],
    predicate: Mapping[str, Any],
    *,
    predicate_type: str = PREDICATE_TYPE,
) -> dict[str, Any]:
    """An in-toto Statement v1 (a certification's, or another document's such as the catalog's)."""
    names = [s["name"] for s in subjects]
    if len(set(names)) != len(names):
        raise IntegrityError("two certificate subjects share a name")
    return {
        "_type": STATEMENT_TYPE,
        "subject": sorted((dict(s) for s in subjects), key=lambda s: s["name"]),
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def sign(stmt: Mapping[str, Any], key: SigningKey) -> dict[str, Any]:
    payload = canonical_bytes(stmt)
    sig = key.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": PAYLOAD_TYPE,
        "signatures": [{"keyid": key.keyid, "sig": base64.b64encode(sig).decode("ascii")}],
    }


def write(path: Path, envelope: Mapping[str, Any]) -> None:
    write_json(path, dict(envelope))


def read_envelope(path: Path) -> dict[str, Any]:
    """The envelope's shape, checked; nothing inside is trusted yet."""
    try:
        data = read_json(Path(path), signed=True)
    except FileNotFoundError:
        raise IntegrityError(f"certificate {path} does not exist") from None
    except OSError as exc:
        raise IntegrityError(f"certificate {path} is not readable: {exc.strerror}") from None
    if not isinstance(data, dict) or not {"payload", "payloadType", "signatures"} <= set(data):
        raise IntegrityError(f"{path} is not a DSSE envelope (needs payload, payloadType, signatures)")
    if not isinstance(data["payload"], str) or not isinstance(data["payloadType"], str):
        raise IntegrityError(f"{path}: payload and payloadType must be strings")
    if not isinstance(data["signatures"], list) or not data["signatures"]:
        raise IntegrityError(f"{path}: the envelope carries no signature")
    if len(data["signatures"]) > MAX_SIGNATURES:
        raise IntegrityError(
            f"{path}: the envelope carries {len(data['signatures'])} signatures; more than "
            f"{MAX_SIGNATURES} are refused before any is checked"
        )
    for s in data["signatures"]:
        if not isinstance(s, dict) or not isinstance(s.get("sig"), str):
            raise IntegrityError(f"{path}: a signature entry is malformed")
    return data


def b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise IntegrityError(f"{what} is not valid base64") from None
