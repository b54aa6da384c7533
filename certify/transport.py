"""What a certificate says of the channels its workers were reached over (issue 43): each stage's gRPC
port as the worker reports it (Info's ``transport``: ``mtls``, ``plaintext-loopback``,
``plaintext-insecure``), the certificate each attached worker presented in the certifier's own
handshake, the frames the ring's pass ports ran (Info's ``pass_frames``: TLS records, authenticated
frames where both stages of a seam allow them, plaintext), and the driver's delivery port (TLS with a
worker's --tls, plain without).  The report and `dgr verify` print these lines; nothing here decides a
verdict."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

DELIVERY_PORT = (
    "the driver's delivery port: mutual TLS records where the stages' gRPC ports are mtls, plaintext TCP "
    "where they are plaintext"
)
UNRECORDED = "not recorded (workers or a certificate older than the transport record)"
# A seam's frames from what its two stages allow (worker/src/mac_frames.h): authenticated frames only
# where both do.
SEAM_FRAMES = {
    ("mac", "mac"): "authenticated frames (Poly1305 tags, not encrypted)",
    ("mac", "tls"): "mutual TLS records",
    ("tls", "tls"): "mutual TLS records",
    ("plaintext", "plaintext"): "plaintext TCP",
}
FRAMES_UNRECORDED = (
    "as the gRPC ports (mutual TLS where mtls, plaintext TCP where plaintext; workers or a certificate older "
    "than the pass frames record)"
)


def _kind(stages: list[str]) -> str:
    kinds = sorted(set(stages))
    if not kinds or kinds == [""]:
        return UNRECORDED
    return kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(k or "unrecorded" for k in kinds)


def _frames(stages: list[str]) -> str:
    """What a placement's pass ports ran: each seam (stage k to the next, the last to the first as a ring
    goes) from what its two stages allow."""
    if not stages or "" in stages:
        return FRAMES_UNRECORDED
    seams = {(min(a, b), max(a, b)) for a, b in zip(stages, stages[1:] + stages[:1], strict=True)}
    kinds = sorted({SEAM_FRAMES.get(seam, "refused (a plaintext stage beside a TLS one)") for seam in seams})
    return kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds)


def _grouped(
    placements: list[Mapping[str, Any]], what: str, kind_of: Callable[[list[str]], str]
) -> list[str]:
    grouped: dict[str, list[str]] = {}
    for p in placements:
        grouped.setdefault(kind_of(list(p.get(what, []))), []).append(str(p.get("name")))
    return [f"{kind}: {', '.join(names)}" for kind, names in sorted(grouped.items())]


def lines(pred: Mapping[str, Any]) -> list[str]:
    """One line per kind of gRPC port with the placements that ran on it, one per attached worker that
    presented a certificate, one per kind of pass port frames, and the delivery port's."""
    placements = pred.get("figures", {}).get("placements", [])
    out = ["gRPC ports " + line for line in _grouped(placements, "transport", _kind)]
    attached = (pred.get("identity", {}).get("attached") or {}).get("workers", [])
    for w in attached:
        fp = w.get("tls_fingerprint")
        if fp:
            pinned = "pinned in the placement file" if w.get("tls_pinned") else "not pinned"
            out.append(f"attached worker {w.get('address')} presented {fp} ({pinned})")
    out += ["the ring's pass ports " + line for line in _grouped(placements, "pass_frames", _frames)]
    return [*out, DELIVERY_PORT]
