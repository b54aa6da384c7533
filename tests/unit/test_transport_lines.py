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
        f"the ring's pass ports {transport.FRAMES_UNRECORDED}: mono, two, metro, odd, old, older",
        transport.DELIVERY_PORT,
    ]


def test_a_seam_runs_authenticated_frames_only_where_both_its_stages_allow_them() -> None:
    pred = _pred(
        [
            {"name": "mono-mac", "pass_frames": ["mac"]},
            {"name": "two-mac", "pass_frames": ["mac", "mac"]},
            {"name": "one-mac", "pass_frames": ["mac", "tls"]},
            {"name": "ring-half", "pass_frames": ["mac", "mac", "tls"]},
            {"name": "plain", "pass_frames": ["plaintext"] * 3},
            {"name": "broken", "pass_frames": ["plaintext", "tls"]},
            {"name": "older", "pass_frames": ["mac", ""]},
        ]
    )
    frames = [line for line in transport.lines(pred) if line.startswith("the ring's pass ports")]
    mac, tls = transport.SEAM_FRAMES[("mac", "mac")], transport.SEAM_FRAMES[("tls", "tls")]
    refused = "refused (a plaintext stage beside a TLS one)"
    assert frames == [
        f"the ring's pass ports {transport.FRAMES_UNRECORDED}: older",
        f"the ring's pass ports {mac}: mono-mac, two-mac",
        f"the ring's pass ports mixed: {mac}, {tls}: ring-half",
        f"the ring's pass ports {tls}: one-mac",
        "the ring's pass ports plaintext TCP: plain",
        f"the ring's pass ports {refused}: broken",
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
    assert len(got) == 5 and got[-1] == transport.DELIVERY_PORT
