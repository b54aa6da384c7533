"""The physical model: bounds per crossing, per seam and per token, relayed vs chained."""

from __future__ import annotations

import pytest

from core.errors import ConfigurationError
from manifests.recipe_model import Placement, Seam
from pipeline import physics, routes
from pipeline.seam_model import crossing_bound_s, link_of

RACK = Seam(delay_ms=1.0, rate_mbit=10_000.0)
METRO = Seam(delay_ms=20.0, rate_mbit=1_000.0)


def _placement(n: int, seams: tuple[Seam, ...] = (RACK,), forwarding: str = "chained") -> Placement:
    return Placement(
        name=f"p{n}",
        stages=tuple((k, k + 1) for k in range(n)),
        forwarding=forwarding,
        seams=seams,
    )


def test_link_bound_is_min_delay_plus_serialisation() -> None:
    link = link_of(METRO)
    # 1 MB at 1 Gbit/s is 8 ms on the wire, after 20 ms of propagation.
    assert crossing_bound_s(1_000_000, link) == pytest.approx(0.020 + 0.008)
    assert crossing_bound_s(10**9, link_of(None)) == 0.0
    assert not physics.shaped(link_of(None)) and physics.shaped(link)
    assert crossing_bound_s(1000, link_of(Seam(rate_mbit=8.0))) == pytest.approx(0.001)
    # Jitter is symmetric around the delay: a frame can arrive (delay - jitter) after it left.
    assert crossing_bound_s(0, link_of(Seam(delay_ms=20, jitter_ms=1))) == pytest.approx(0.019)


def test_monolithic_and_unshaped_placements_have_no_seam_cost() -> None:
    mono = Placement(name="m", stages=((0, 12),))
    assert physics.crossings(mono, routes.Relayed(), boundary_bytes=[], n_vocab=10)[1].bound_s == 0.0
    loop = _placement(4, seams=())
    m = physics.model(
        loop,
        routes.Chained(),
        {
            "seam_bytes_per_token": [8] * 3,
            "seam_s": [1e-4] * 3,
            "stage_compute_s": [1e-3] * 4,
            "decode_tok_s": {"median": 100.0},
        },
        n_vocab=10,
    )
    assert not m["shaped"] and m["crossing_bound_s"] == 0.0 and m["seams"][0]["ratio"] is None


def test_chained_crosses_each_seam_once_relayed_twice_per_stage() -> None:
    p = _placement(4)
    chained = physics.crossings(p, routes.Chained(), boundary_bytes=[1024] * 3, n_vocab=32000)
    relayed = physics.crossings(p, routes.Relayed(), boundary_bytes=[1024] * 3, n_vocab=32000)
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
    parts = physics.crossings(p, routes.Chained(), boundary_bytes=[1000, 1000], n_vocab=10)
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
    m = physics.model(p, routes.Chained(), speed, n_vocab=1000)
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
    speed = {
        "seam_bytes_per_token": [1024],
        "seam_s": [0.05],
        "stage_compute_s": [0.0, 0.0],
        "decode_tok_s": {"median": 10.0},
    }
    m = physics.model(p, routes.Relayed(), speed, n_vocab=1000)
    # Stage 1's round trip: the boundary in (20 ms + 1024 B) and the logits back (20 ms + 4000 B).
    assert m["seams"][0]["bound_s"] == pytest.approx(0.040 + (1024 + 4000) * 8 / 1e9)
    assert m["crossings_per_token"] == 4


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="3 seam byte counts"):
        physics.crossings(_placement(4), routes.Chained(), boundary_bytes=[1], n_vocab=1)
    with pytest.raises(
        ConfigurationError,
        match="forwarding 'carrier-pigeon' is not one of relayed, pipelined, chained, ring",
    ):
        routes.spec_named("carrier-pigeon")


def test_per_seam_bounds_chained_and_relayed_with_the_driver_on_seam_0() -> None:
    p = Placement(
        name="three-links",
        stages=((0, 3), (3, 6), (6, 9), (9, 12)),
        seams=tuple(Seam(delay_ms=d, rate_mbit=8) for d in (1, 2, 3)),
    )
    chained = physics.crossings(p, routes.Chained(), boundary_bytes=[1000] * 3, n_vocab=32000)
    bounds = [physics.seam_bound(routes.Chained(), k, chained) for k in range(3)]
    # the boundary and its token id (1004 B: 1.004 ms at 8 Mbit/s) into stage k+1, over seam k's link
    assert bounds == pytest.approx([0.001 + 0.001004, 0.002 + 0.001004, 0.003 + 0.001004])
    relayed = physics.crossings(p, routes.Relayed(), boundary_bytes=[1000] * 3, n_vocab=32000)
    bounds = [physics.seam_bound(routes.Relayed(), k, relayed) for k in range(3)]
    # the boundary into stage k+1, then stage k+1's reply into the driver (seam 0's link); the last
    # reply is the logits row (128 000 B: 128 ms at 8 Mbit/s)
    assert bounds == pytest.approx([0.002 + 0.002, 0.003 + 0.002, 0.004 + 0.001 + 0.128])


def test_decode_token_bound_counts_every_crossing_of_a_pass() -> None:
    p = _placement(4, seams=(Seam(delay_ms=5, rate_mbit=8),))
    speed = {
        "seam_bytes_per_token": [1000] * 3,
        "seam_s": [0.01] * 3,
        "stage_compute_s": [0.001, 0.002, 0.001, 0.002],
        "decode_tok_s": {"median": 10.0},
    }
    one = {n: 0.005 + n * 1e-6 for n in (4, 1000, 1004, 40)}  # 8 Mbit/s: 1 us per byte
    chained = physics.model(p, routes.Chained(), speed, n_vocab=10)
    # token into stage 0, three boundaries (+ token id) stage to stage, logits into the driver's sink
    assert chained["token_bound_s"] == pytest.approx(0.006 + one[4] + 3 * one[1004] + one[40])
    relayed = physics.model(p, routes.Relayed(), speed, n_vocab=10)
    # each stage called by the driver: request in, reply (boundary; the last: logits) back
    assert relayed["token_bound_s"] == pytest.approx(0.006 + one[4] + 3 * one[1000] + 3 * one[1000] + one[40])
    assert relayed["token_bound_s"] > chained["token_bound_s"]


def test_a_ring_crosses_each_seam_once_and_never_reaches_the_driver_on_the_critical_path() -> None:
    p = _placement(12, seams=(METRO,), forwarding="ring")
    ring = physics.crossings(p, routes.Ring(), boundary_bytes=[1024] * 11, n_vocab=32000)
    chained = physics.crossings(p, routes.Chained(), boundary_bytes=[1024] * 11, n_vocab=32000)
    assert len(ring) == 12 and [c.into for c in ring] == [f"stage {k}" for k in range(12)]
    assert ring == chained[:-1]  # chained's last leg (logits into the driver) is off the ring's path
    assert physics.seam_bound(routes.Ring(), 3, ring) == physics.seam_bound(routes.Chained(), 3, chained)
    speed = {
        "seam_bytes_per_token": [1024] * 11,
        "seam_s": [0.021] * 11,
        "stage_compute_s": [1e-3] * 12,
        "decode_tok_s": {"median": 3.5},
    }
    m = physics.model(p, routes.Ring(), speed, n_vocab=32000)
    assert m["crossings_per_token"] == 12 and m["forwarding"] == "ring"
    assert m["token_bound_s"] == pytest.approx(12e-3 + sum(c.bound_s for c in ring))
