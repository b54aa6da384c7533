"""certify.transport: the lines the report and `dgr verify` print of how workers were reached."""

from __future__ import annotations

from certify import transport


def _pred(placements: list[dict], workers: list[dict] | None = None) -> dict:
    ident = {"attached": {"workers": workers}} if workers is not None else {}
    return {"figures": {"placements": placements}, "identity": ident}


def test_placements_are_grouped_by_their_stages_transport() -> None:
    pred = _pred(
        [
            {"name": "mono", "transport": ["mtls"]},
            {"name": "two", "transport": ["mtls", "mtls"]},
            {"name": "metro", "transport": ["plaintext-insecure"] * 4},
            {"name": "odd", "transport": ["mtls", "plaintext-loopback"]},
            {"name": "old"},
            {"name": "older", "transport": ["", ""]},
        ]
    )
    assert transport.lines(pred) == [
        "gRPC ports mixed: mtls, plaintext-loopback: odd",
        "gRPC ports mtls: mono, two",
        f"gRPC ports {transport.UNRECORDED}: old, older",
        "gRPC ports plaintext-insecure: metro",
        transport.RAW_PORTS,
    ]


def test_each_attached_workers_presented_certificate_is_a_line() -> None:
    fp = "sha256:" + "cd" * 32
    pred = _pred(
        [{"name": "mono", "transport": ["mtls"]}],
        [
            {"address": "10.0.0.2:7001", "tls_fingerprint": fp, "tls_pinned": True},
            {"address": "10.0.0.3:7001", "tls_fingerprint": fp, "tls_pinned": False},
            {"address": "10.0.0.4:7001", "tls_fingerprint": None},
        ],
    )
    got = transport.lines(pred)
    assert got[1] == f"attached worker 10.0.0.2:7001 presented {fp} (pinned in the placement file)"
    assert got[2] == f"attached worker 10.0.0.3:7001 presented {fp} (not pinned)"
    assert len(got) == 4 and got[-1] == transport.RAW_PORTS
