"""The slow suite's rule for a loaded machine (tests/integration/dgr_cli.load_bound_misses): only the
speed gate's time limits may fail a certification the tests otherwise accept."""

from __future__ import annotations

import pytest

from tests.integration.dgr_cli import load_bound_misses


def _result(name: str, status: str, *failed: str) -> dict:
    rows = [{"check": c, "ok": False} for c in failed] + [{"check": "other", "ok": True}]
    return {"name": name, "status": status, "reason": ", ".join(failed), "details": {"rows": rows}}


def test_a_speed_floor_missed_under_load_is_named_and_accepted() -> None:
    pred = {
        "results": [
            _result("staging-parity/two-middle", "PASS"),
            _result("placement/x", "SKIPPED"),
            _result("speed/three-middle-last", "FAIL", "decode tok/s (median)"),
        ]
    }
    assert load_bound_misses(pred) == ["speed/three-middle-last: decode tok/s (median)"]
    assert load_bound_misses({"results": [_result("speed/mono", "PASS")]}) == []


@pytest.mark.parametrize(
    "result",
    [
        _result("staging-parity/two-middle", "FAIL", "top-1 agreement"),
        _result(
            "speed/wan", "FAIL", "fastest seam / its physical bound (shaping applied)"
        ),  # not load's doing
        _result("speed/mono", "FAIL", "concurrent sessions unlike one alone"),
        _result("speed/mono", "FAIL", "decode tok/s (median)", "concurrent sessions unlike one alone"),
        _result("route-change/three-first-middle", "ERROR"),
    ],
)
def test_anything_else_that_failed_fails_the_test(result: dict) -> None:
    with pytest.raises(AssertionError):
        load_bound_misses({"results": [result]})
