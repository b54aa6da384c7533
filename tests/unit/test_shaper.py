"""pipeline.shaper's timing rules on synthetic timelines (the I/O loop only asks Schedule when to deliver)."""

from __future__ import annotations

import random

import pytest

from pipeline.shaper import Link, Schedule

MSS = 1448
MiB = 1 << 20


def _chunks(total: int, size: int = MSS) -> list[int]:
    return [min(size, total - i) for i in range(0, total, size)]


def test_a_burst_arrives_no_earlier_than_the_bound_and_in_order() -> None:
    link = Link(delay_s=0.010, rate_bps=8e6)
    sched = Schedule(link)
    releases = [sched.release(0.0, n) for n in _chunks(MiB)]
    assert releases == sorted(releases)
    bound = 0.010 + MiB * 8 / 8e6
    assert releases[-1] >= bound - 1e-9  # float sums of 725 wire times
    assert releases[-1] == pytest.approx(bound)  # serialised back to back, nothing faster, nothing lost
    assert releases[0] == pytest.approx(0.010 + MSS * 8 / 8e6)


def test_frames_slower_than_the_rate_only_pay_serialisation_and_delay() -> None:
    link = Link(delay_s=0.005, rate_bps=100e6)
    sched = Schedule(link)
    for i in range(50):
        now = i * 0.001  # 1 ms apart: the wire is idle again for each frame
        assert sched.release(now, 1000) == pytest.approx(now + 0.005 + 1000 * 8 / 100e6)


def test_the_wire_is_busy_until_the_previous_frame_is_serialised() -> None:
    sched = Schedule(Link(delay_s=0.0, rate_bps=8e6))  # 1 byte per microsecond
    assert sched.release(0.0, 1000) == pytest.approx(0.001)
    assert sched.release(0.0005, 1000) == pytest.approx(0.002)  # waits for the first frame's wire time
    assert sched.release(0.010, 1000) == pytest.approx(0.011)  # idle wire: no credit saved up (no burst)


def test_unlimited_rate_is_pure_delay() -> None:
    sched = Schedule(Link(delay_s=0.020))
    assert [sched.release(t, 60000) for t in (0.0, 0.0, 1.0)] == [
        pytest.approx(0.02),
        pytest.approx(0.02),
        pytest.approx(1.02),
    ]


def test_jitter_stays_in_its_window_and_never_reorders() -> None:
    link = Link(delay_s=0.010, jitter_s=0.004, rate_bps=1e9)
    sched = Schedule(link, random.Random(5))
    arrivals = [i * 0.0001 for i in range(2000)]  # denser than the jitter: reordering would be easy
    releases = [sched.release(t, 1500) for t in arrivals]
    assert releases == sorted(releases)
    tx = 1500 * 8 / 1e9
    lateness = [r - t for r, t in zip(releases, arrivals, strict=True)]
    assert min(lateness) >= link.min_delay_s + tx - 1e-12
    # Monotone release may hold a frame behind a later-drawn one, so only the early side is exact; the
    # late side is bounded by the window plus the spacing of arrivals.
    assert max(lateness) <= 0.010 + 0.004 + tx + 1e-9
    assert max(lateness) - min(lateness) > 0.002  # the jitter is really applied


def test_widely_spaced_frames_see_the_whole_jitter_distribution() -> None:
    sched = Schedule(Link(delay_s=0.010, jitter_s=0.002), random.Random(1))
    delays = [sched.release(float(i), 100) - i for i in range(4000)]
    assert min(delays) >= 0.008 and max(delays) <= 0.012
    assert min(delays) < 0.0082 and max(delays) > 0.0118
    assert sum(delays) / len(delays) == pytest.approx(0.010, abs=2e-4)


def test_min_delay_and_serialisation() -> None:
    assert Link(delay_s=0.001, jitter_s=0.005).min_delay_s == 0.0
    assert Link(delay_s=0.010, jitter_s=0.002).min_delay_s == pytest.approx(0.008)
    assert Link(rate_bps=1e9).serialisation_s(125_000_000) == pytest.approx(1.0)
    assert Link().serialisation_s(10**12) == 0.0


@pytest.mark.parametrize("bad", [dict(delay_s=-1.0), dict(jitter_s=-0.1), dict(rate_bps=0.0)])
def test_a_link_refuses_impossible_profiles(bad) -> None:
    with pytest.raises(ValueError):
        Link(**bad)


def test_a_link_in_the_units_of_recipes_and_the_shaper_flags() -> None:
    metro = Link.of(delay_ms=20, jitter_ms=1, rate_mbit=1000)
    assert metro == Link(delay_s=0.020, jitter_s=0.001, rate_bps=1e9)
    assert metro.in_ms() == {"delay_ms": 20.0, "jitter_ms": 1.0, "rate_mbit": 1000.0}
    assert Link.of() == Link() and Link().in_ms() == {"delay_ms": 0.0, "jitter_ms": 0.0, "rate_mbit": None}
