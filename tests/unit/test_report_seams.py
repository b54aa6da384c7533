"""The report's seam section: tables of seams against their bounds, and the scaling chart."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from manifests.recipe_model import Placement, Seam
from pipeline import physics, routes
from reports import seams

METRO = Seam(delay_ms=20.0, rate_mbit=1000.0)


def _record(n: int, forwarding: str, tok_s: float, seam: Seam | None = METRO) -> dict:
    p = Placement(
        name=f"metro-{n}-{forwarding}",
        stages=tuple((k, k + 1) for k in range(n)),
        forwarding=forwarding,
        seams=(seam,) if seam else (),
    )
    speed = {
        "seam_bytes_per_token": [1024] * (n - 1),
        "seam_s": [0.0205] * (n - 1),
        "stage_compute_s": [0.001] * n,
        "decode_tok_s": {"median": tok_s},
    }
    return {
        "name": p.name,
        "n_stages": n,
        "seam_model": physics.model(
            p, routes.spec_named(forwarding), speed, n_vocab=32000, backend="userspace shaper"
        ),
    }


PLACEMENTS = [
    _record(2, "chained", 15.0),
    _record(4, "chained", 9.0),
    _record(12, "chained", 3.5),
    _record(4, "relayed", 5.5),
    {"name": "mono", "n_stages": 1},
]


def test_seam_table_has_a_row_per_seam_with_bound_and_ratio() -> None:
    frame = seams.seam_frame(PLACEMENTS)
    assert frame is not None and len(frame) == 1 + 3 + 11 + 3
    row = frame.iloc[0]
    assert row["link"] == "20 ms one way (RTT 40 ms), 1 Gbit/s"
    assert row["bound ms"] == f"{(0.020 + 1028 * 8 / 1e9) * 1e3:.3f}"
    assert float(row["measured / bound"]) > 1.0


def test_token_table_compares_crossings() -> None:
    frame = seams.token_frame(PLACEMENTS)
    assert frame is not None
    by_name = {r["placement"]: r for _, r in frame.iterrows()}
    assert by_name["metro-4-chained"]["crossings / token"] == 5
    assert by_name["metro-4-relayed"]["crossings / token"] == 8


def test_scaling_chart_is_valid_svg_with_a_line_per_group() -> None:
    svg = str(seams.scaling_chart(PLACEMENTS, title="Scaling <with> stages"))
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    # two groups (chained, relayed): measured + bound + share each
    assert len(lines) == 6
    assert "Scaling &lt;with&gt; stages" in svg
    assert seams.scaling_chart([{"name": "mono", "n_stages": 1}], title="x") == ""


FLOOR = {
    "round_trips": 300,
    "load_average": 1.5,
    "sizes": [
        {
            "bytes": 1024,
            "tcp_round_trip_s": {"median": 2e-5, "q1": 1.9e-5, "q3": 2.2e-5},
            "grpc_round_trip_s": {"median": 4e-4, "q1": 3.8e-4, "q3": 4.4e-4},
        }
    ],
}


def _under_test(records: list[dict]) -> list[dict]:
    return [{**r, "role": "under test"} for r in records if r.get("seam_model")]


def test_floor_table_reads_a_chained_seam_against_half_a_round_trip_and_a_relayed_one_against_one() -> None:
    frame = seams.floor_frame(_under_test(PLACEMENTS), FLOOR)
    assert frame is not None and len(frame) == 1 + 3 + 11 + 3
    chained = frame[frame["forwarding"] == "chained"].iloc[0]
    relayed = frame[frame["forwarding"] == "relayed"].iloc[0]
    assert (chained["crossings"], chained["gRPC floor ms"], chained["TCP floor ms"]) == (1, "0.200", "0.010")
    assert (relayed["crossings"], relayed["gRPC floor ms"], relayed["TCP floor ms"]) == (2, "0.400", "0.020")
    assert chained["measured / gRPC floor"] == f"{0.0205 / 2e-4:.1f}×"  # 20.5 ms of shaped delay
    assert chained["shaped bound ms"] != "—"


def test_floor_table_sets_each_seam_beside_the_floors_between_processes() -> None:
    """The one-core and two-core process floors (a later certificate's) beside the in-process one; a
    certificate without the two-core figure (one CPU) shows a dash in its place."""
    row = {
        **FLOOR["sizes"][0],
        "tcp_one_core_round_trip_s": {"median": 8e-6, "q1": 7e-6, "q3": 9e-6},
        "tcp_two_cores_round_trip_s": {"median": 6e-5, "q1": 5e-5, "q3": 7e-5},
    }
    frame = seams.floor_frame(_under_test(PLACEMENTS), {**FLOOR, "sizes": [row]})
    chained = frame[frame["forwarding"] == "chained"].iloc[0]
    assert chained["process floor ms (1 core / 2 cores)"] == "0.004 / 0.030"
    assert (
        chained["measured / process floor (1 core / 2 cores)"]
        == f"{0.0205 / 4e-6:.1f}× / {0.0205 / 3e-5:.1f}×"
    )
    one_cpu = {k: v for k, v in row.items() if k != "tcp_two_cores_round_trip_s"}
    frame = seams.floor_frame(_under_test(PLACEMENTS), {**FLOOR, "sizes": [one_cpu]})
    assert frame.iloc[0]["process floor ms (1 core / 2 cores)"].endswith(" / —")
    note = seams.floor_note({**FLOOR, "sizes": [row]})
    assert "TCP between processes on 1 core 0.008 ms, TCP between processes on 2 cores 0.060 ms" in note


def test_floor_table_skips_what_it_cannot_read_against_a_floor() -> None:
    assert seams.floor_frame(_under_test(PLACEMENTS), None) is None  # an older certificate: no floor
    other_size = {**FLOOR, "sizes": [{**FLOOR["sizes"][0], "bytes": 2048}]}
    assert seams.floor_frame(_under_test(PLACEMENTS), other_size) is None
    assert seams.floor_frame(PLACEMENTS, FLOOR) is None  # no placement under test
    note = seams.floor_note(FLOOR)
    assert note is not None and "1,024 bytes: gRPC 0.400 ms (IQR 0.380-0.440), TCP 0.020 ms" in note
    assert "between processes" not in note  # an older certificate's floor has no process rows
    assert "load average 1.50" in note


def test_a_ring_placement_names_how_its_passes_crossed() -> None:
    streamed = {**_record(4, "ring", 10.0), "ring_transport": "tcp pass port"}
    streamed["speed"] = {"ring_deliveries": "frames"}  # what a certificate after the delivery port records
    unary = {**_record(2, "ring", 12.0), "name": "metro-2-ring-unary", "ring_transport": "grpc forward"}
    frame = seams.floor_frame(_under_test([streamed, unary]), FLOOR)
    assert frame is not None
    # the unary record is an older certificate's: it says nothing of its deliveries
    assert set(frame["forwarding"]) == {"ring (tcp pass port, deliveries as frames)", "ring (grpc forward)"}
    assert (frame["crossings"] == 1).all()  # one crossing per seam either way: read against half a trip


def test_floor_table_shows_the_tls_floors_of_a_run_over_tls_and_nothing_of_them_otherwise() -> None:
    row = {
        **FLOOR["sizes"][0],
        "tls_tcp_round_trip_s": {"median": 3e-5, "q1": 2.8e-5, "q3": 3.3e-5},
        "grpc_tls_round_trip_s": {"median": 5e-4, "q1": 4.7e-4, "q3": 5.4e-4},
    }
    chained = seams.floor_frame(_under_test(PLACEMENTS), {**FLOOR, "sizes": [row]}).query(
        "forwarding == 'chained'"
    )
    first = chained.iloc[0]
    assert (first["gRPC+TLS floor ms"], first["TCP+TLS floor ms"]) == ("0.250", "0.015")
    assert first["measured / TCP+TLS floor"] == f"{0.0205 / 1.5e-5:.1f}×"
    assert "TCP+TLS floor ms" not in seams.floor_frame(_under_test(PLACEMENTS), FLOOR).columns


def test_the_tls_floors_are_measured_over_real_mutual_tls(tmp_path) -> None:
    """pipeline.transport_floor with the run's identities: TLS rows beside the plain ones, each a real
    round trip (the echo refuses bytes that did not come back)."""
    from pipeline import transport_floor
    from worker import tls_ca
    from worker.tls import load

    worker, driver = tls_ca.loopback(tmp_path)
    got = transport_floor.measure([1024], round_trips=20, warmup=2, tls=(load(worker), driver))
    (row,) = got["sizes"]
    assert row["tls_tcp_round_trip_s"]["median"] > 0 and row["grpc_tls_round_trip_s"]["median"] > 0
    plain = transport_floor.measure([1024], round_trips=5, warmup=1)["sizes"][0]
    assert "tls_tcp_round_trip_s" not in plain
