"""The report's throughput table (reports.throughput) on placement records made by hand."""

from __future__ import annotations

from reports import throughput


def _level(sessions: int, median: float, diverging: int = 0) -> dict:
    return {
        "sessions": sessions,
        "aggregate_tok_s": {"median": median, "iqr": 1.0},
        "diverging_sessions": diverging,
    }


def _placement(name: str, n: int, role: str, levels: list[dict]) -> dict:
    return {
        "name": name,
        "n_stages": n,
        "role": role,
        "forwarding": "relayed",
        "speed": {"concurrency": {"levels": levels}},
    }


PLACEMENTS = [
    _placement("mono", 1, "reference", [_level(1, 50.0), _level(4, 40.0)]),
    _placement(
        "twelve",
        12,
        "under test",
        [
            _level(1, 25.0),
            _level(12, 100.0, diverging=1),
            _level(4, 60.0),
            {"sessions": 16, "skipped": "the workers hold fewer sessions"},
        ],
    ),
    {"name": "older", "n_stages": 2, "role": "under test", "speed": {}},  # measured before the table
]


def test_levels_are_columns_in_order_and_ratios_are_to_the_monolithic_single_session() -> None:
    frame = throughput.concurrency_frame(PLACEMENTS)
    assert frame is not None and list(frame["placement"]) == ["mono", "twelve"]
    assert list(frame.columns)[3:] == [f"{c} at once: tok/s" for c in (1, 4, 12, 16)]
    twelve = frame.iloc[1]
    assert twelve["12 at once: tok/s"] == "100.0 (IQR 1.0) = 2.00×, 1 unlike alone"
    assert twelve["16 at once: tok/s"] == "skipped"
    assert frame.iloc[0]["12 at once: tok/s"] == "—"
    assert throughput.concurrency_note(PLACEMENTS) == "50.0 tok/s"


def test_no_table_without_concurrency_figures() -> None:
    assert throughput.concurrency_frame(PLACEMENTS[2:]) is None
    assert throughput.concurrency_note(PLACEMENTS[1:]) is None
