"""What a certificate says of the channels its workers were reached over (issue 43): each stage's gRPC
port as the worker reports it (Info's ``transport``: ``mtls``, ``plaintext-loopback``,
``plaintext-insecure``), the certificate each attached worker presented in the certifier's own
handshake, and how the raw TCP ports go with them (the ring's pass ports and the driver's delivery
port: TLS with a worker's --tls, plain without).  The report and `dgr verify` print these lines;
nothing here decides a verdict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RAW_PORTS = (
    "the ring's pass ports and the driver's delivery port: mutual TLS where the stages' gRPC ports are mtls, "
    "plaintext TCP where they are plaintext"
)
UNRECORDED = "not recorded (workers or a certificate older than the transport record)"


def _kind(stages: list[str]) -> str:
    kinds = sorted(set(stages))
    if not kinds or kinds == [""]:
        return UNRECORDED
    return kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(k or "unrecorded" for k in kinds)


def lines(pred: Mapping[str, Any]) -> list[str]:
    """One line per kind of gRPC port with the placements that ran on it, one per attached worker that
    presented a certificate, and how the raw TCP ports go with them."""
    grouped: dict[str, list[str]] = {}
    for p in pred.get("figures", {}).get("placements", []):
        grouped.setdefault(_kind(list(p.get("transport", []))), []).append(str(p.get("name")))
    out = [f"gRPC ports {kind}: {', '.join(names)}" for kind, names in sorted(grouped.items())]
    attached = (pred.get("identity", {}).get("attached") or {}).get("workers", [])
    for w in attached:
        fp = w.get("tls_fingerprint")
        if fp:
            pinned = "pinned in the placement file" if w.get("tls_pinned") else "not pinned"
            out.append(f"attached worker {w.get('address')} presented {fp} ({pinned})")
    return [*out, RAW_PORTS]
