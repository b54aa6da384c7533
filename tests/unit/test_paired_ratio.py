"""The benches' paired ratio (tests/bench/ways.paired_ratio): a drift in the machine's speed between
rounds, which hits both sides of a round alike, leaves it at the true ratio; its spread over the rounds,
and the round count a run may set."""

from __future__ import annotations

import pytest

from certify.metrics import median_iqr
from tests.bench.ways import bench_rounds, paired_ratio, paired_spread


def test_a_drift_between_rounds_cancels() -> None:
    drift = [1.0, 1.6, 0.7, 1.3, 0.9]  # the VM's speed in each round
    reference = [[200.0 * d, 210.0 * d, 190.0 * d] for d in drift]
    staged = [[0.8 * v for v in ref] for ref in reference]
    staged[2] = staged[2][:2]  # a round with fewer runs still pairs
    assert paired_ratio(staged, reference) == pytest.approx(0.8)
    # the ratio of the whole run's medians is not (the rounds' drift is in it)
    whole_run = (
        median_iqr([v for r in staged for v in r]).median
        / median_iqr([v for r in reference for v in r]).median
    )
    assert whole_run != pytest.approx(0.8)


def test_rounds_must_pair() -> None:
    with pytest.raises(ValueError, match="rounds"):
        paired_ratio([[1.0]], [[1.0], [2.0]])
    with pytest.raises(ValueError, match="rounds"):
        paired_ratio([], [])


def test_the_spread_is_the_lowest_and_highest_rounds_ratio() -> None:
    reference = [[100.0, 100.0], [200.0], [50.0, 50.0, 50.0]]
    staged = [[90.0, 94.0], [200.0], [40.0, 40.0, 60.0]]  # 0.92, 1.0, 0.8 round by round
    assert paired_spread(staged, reference) == pytest.approx((0.8, 1.0))
    assert paired_ratio(staged, reference) == pytest.approx(0.92)
    with pytest.raises(ValueError, match="rounds"):
        paired_spread([[1.0]], [])


def test_bench_rounds_is_the_default_unless_the_environment_sets_it(monkeypatch) -> None:
    monkeypatch.delenv("DGR_BENCH_ROUNDS", raising=False)
    assert bench_rounds(3) == 3
    monkeypatch.setenv("DGR_BENCH_ROUNDS", "8")
    assert bench_rounds(3) == 8
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv("DGR_BENCH_ROUNDS", bad)
        with pytest.raises(ValueError, match="DGR_BENCH_ROUNDS"):
            bench_rounds(3)
