"""Parity and speed metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from certify import metrics


def test_log_softmax_is_stable_for_huge_logits() -> None:
    z = np.array([[1e4, 1e4 - 1.0, -1e4]])
    lp = metrics.log_softmax(z)
    assert np.isfinite(lp).all()
    assert math.isclose(np.exp(lp).sum(), 1.0, rel_tol=1e-12)
    assert math.isclose(lp[0, 0] - lp[0, 1], 1.0, rel_tol=1e-12)


def test_kl_identical_is_exactly_zero_and_known_value() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 50)).astype(np.float32)
    assert (metrics.kl_divergence(a, a) == 0.0).all()
    # Two-outcome distributions: P = (0.5, 0.5), Q = (e/(1+e), 1/(1+e)) -> KL = log(1+e)/... by hand.
    p = np.array([0.0, 0.0])
    q = np.array([1.0, 0.0])
    qp = np.array([math.e / (1 + math.e), 1 / (1 + math.e)])
    expected = 0.5 * math.log(0.5 / qp[0]) + 0.5 * math.log(0.5 / qp[1])
    assert math.isclose(float(metrics.kl_divergence(p, q)[0]), expected, rel_tol=1e-12)


def test_kl_shift_invariant_and_positive() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 20))
    assert np.allclose(metrics.kl_divergence(a, a + 7.5), 0.0, atol=1e-12)
    assert (metrics.kl_divergence(a, a * 1.1) > 0).all()


def test_kl_of_a_mix_of_equal_and_differing_rows_is_the_full_computation_bit_for_bit() -> None:
    """Equal rows skip their softmax: every row's figure must still be what the softmax of all rows
    gives (a NaN row is never "equal" and stays NaN)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 300)).astype(np.float32) * 8
    b = a.copy()
    b[1] += 1e-3
    b[4, 7] = np.nextafter(b[4, 7], np.float32(np.inf))
    a[5, 0] = b[5, 0] = np.nan
    lp, lq = metrics.log_softmax(a), metrics.log_softmax(b)
    full = np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)
    got = metrics.kl_divergence(a, b)
    assert got.tobytes() == full.tobytes()
    assert got[0] == got[2] == got[3] == 0.0 and got[1] > 0 and got[4] > 0 and np.isnan(got[5])


def test_top1_agreement() -> None:
    ref = np.array([[0, 1, 2], [3, 0, 0], [0, 5, 1], [1, 1, 9]], dtype=np.float32)
    cur = ref.copy()
    cur[1] = [0, 4, 0]
    assert metrics.top1_agreement(ref, cur) == 0.75


def test_nmse_values_and_edge_cases() -> None:
    ref = np.array([3.0, 4.0])
    assert metrics.nmse(ref, ref) == 0.0
    assert math.isclose(metrics.nmse(ref, [3.0, 5.0]), 1.0 / 25.0)
    assert metrics.nmse([0.0, 0.0], [0.0, 0.0]) == 0.0
    assert metrics.nmse([0.0, 0.0], [0.0, 1e-30]) == math.inf
    assert metrics.nmse(ref, [3.0, float("nan")]) == math.inf
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.nmse(ref, [1.0, 2.0, 3.0])


def test_greedy_match_prefix() -> None:
    assert metrics.greedy_match([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert metrics.greedy_match([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert metrics.greedy_match([1, 2, 3, 4], [1, 2]) == 0.5
    assert metrics.greedy_match([], [5]) == 1.0
    assert metrics.common_prefix([1, 2, 3], [1, 2, 9, 4]) == 2 and metrics.common_prefix([], [5]) == 0


def test_median_iqr() -> None:
    s = metrics.median_iqr([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s.median == 3.0
    assert s.iqr == 2.0
    assert s.n == 5
    with pytest.raises(ValueError):
        metrics.median_iqr([])


@pytest.mark.parametrize("fill", ["random", "zeros", "one-inf", "one-apart"])
def test_logit_figures_of_equal_rows_are_the_metrics_own(fill: str) -> None:
    """measure.logit_figures skips its float64 passes for finite rows equal bit for bit: whatever the
    rows, its figures must be what the metrics give."""
    from certify.measure import logit_figures, logit_figures_in_full

    a = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32) * 6
    if fill == "zeros":
        a[:] = 0
    b = a.copy()
    if fill == "one-inf":
        a[2, 3] = b[2, 3] = np.inf
    if fill == "one-apart":
        b[1, 1] = np.nextafter(b[1, 1], np.float32(np.inf))
    with np.errstate(invalid="ignore"):
        full = logit_figures_in_full(a, b)
        got = logit_figures(a, b)
    assert repr(got) == repr(full)
