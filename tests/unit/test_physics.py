"""The physical model: bounds per crossing, per seam and per token, relayed vs chained."""

from __future__ import annotations

import pytest

from certify import physics
from certify.recipes import Placement, Seam

RACK = Seam(delay_ms=1.0, rate_mbit=10_000.0)
METRO = Seam(delay_ms=20.0, rate_mbit=1_000.0)


def _placement(n: int, seams: tuple[Seam, ...] = (RACK,), forwarding: str = "chained") -> Placement:
    return Placement(name=f"p{n}", stages=tuple((k, k + 1) for k in range(n)), forwarding=forwarding, seams=seams)


def test_link_bound_is_delay_plus_serialisation() -> None:
    link = physics.Link.of(METRO)
    # 1 MB at 1 Gbit/s is 8 ms on the wire, after 20 ms of propagation.
    assert link.bound(1_000_000) == pytest.approx(0.020 + 0.008)
    assert physics.Link.of(None).bound(10**9) == 0.0
    assert not physics.Link.of(None).shaped
    assert physics.Link.of(Seam(rate_mbit=8.0)).bound(1000) == pytest.approx(0.001)


def test_chained_crosses_each_seam_once_relayed_twice_per_stage() -> None:
    p = _placement(4)
    chained = physics.crossings(p, "chained", boundary_bytes=[1024] * 3, n_vocab=32000)
    relayed = physics.crossings(p, "relayed", boundary_bytes=[1024] * 3, n_vocab=32000)
    assert len(chained) == 4 + 1
    assert len(relayed) == 2 * 4
    assert [c.into for c in chained] == ["stage 0", "stage 1", "stage 2", "stage 3", "driver"]
    assert chained[-1].payload_bytes == 32000 * 4
    # Token ids ride with every chained boundary; relayed stages without a sideband get none.
    assert chained[1].payload_bytes == 1024 + 4
    assert relayed[2].payload_bytes == 1024
    assert relayed[3].payload_bytes == 1024  # stage 1's boundary reply into the driver


def test_per_seam_profiles_shape_the_link_into_the_next_stage() -> None:
    p = _placement(3, seams=(RACK, METRO))
    parts = physics.crossings(p, "chained", boundary_bytes=[1000, 1000], n_vocab=10)
    assert parts[1].bound_s == pytest.approx(0.001 + 1004 * 8 / 10e9)  # into stage 1: seam 0
    assert parts[2].bound_s == pytest.approx(0.020 + 1004 * 8 / 1e9)  # into stage 2: seam 1
    assert parts[0].bound_s == pytest.approx(0.001 + 4 * 8 / 10e9)  # stage 0 and the driver: seam 0


def test_model_ratios_and_token_bound() -> None:
    p = _placement(2, seams=(METRO,))
    speed = {
        "seam_bytes_per_token": [1024],
        "seam_s": [0.0215],
        "stage_compute_s": [0.001, 0.002],
        "decode_tok_s": {"median": 10.0},
    }
    m = physics.model(p, "chained", speed, n_vocab=1000)
    seam = m["seams"][0]
    assert seam["bound_s"] == pytest.approx(0.020 + 1028 * 8 / 1e9)
    assert seam["ratio"] == pytest.approx(0.0215 / seam["bound_s"])
    assert seam["rtt_ms"] == pytest.approx(40.0)
    assert m["crossings_per_token"] == 3
    bound = 0.003 + sum(c["bound_s"] for c in m["crossings"])
    assert m["token_bound_s"] == pytest.approx(bound)
    assert m["efficiency"] == pytest.approx(bound / 0.1)
    assert m["seam_share"] == pytest.approx((0.1 - 0.003) / 0.1)


def test_relayed_seam_bound_counts_the_reply_into_the_driver() -> None:
    p = _placement(2, seams=(METRO,), forwarding="relayed")
    speed = {"seam_bytes_per_token": [1024], "seam_s": [0.05], "stage_compute_s": [0.0, 0.0],
             "decode_tok_s": {"median": 10.0}}
    m = physics.model(p, "relayed", speed, n_vocab=1000)
    # Stage 1's round trip: the boundary in (20 ms + 1024 B) and the logits back (20 ms + 4000 B).
    assert m["seams"][0]["bound_s"] == pytest.approx(0.040 + (1024 + 4000) * 8 / 1e9)
    assert m["crossings_per_token"] == 4


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="3 seam byte counts"):
        physics.crossings(_placement(4), "chained", boundary_bytes=[1], n_vocab=1)
    with pytest.raises(ValueError, match="unknown forwarding"):
        physics.crossings(_placement(2), "carrier-pigeon", boundary_bytes=[1], n_vocab=1)
