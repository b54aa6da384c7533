"""Parity and speed metrics, pure numpy.  Everything is computed in float64 so the metric itself
adds no noise to what it measures (f32 logits compared bitwise must give exactly 0)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike


def _rows(x: ArrayLike) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return a.reshape(1, -1) if a.ndim == 1 else a.reshape(-1, a.shape[-1])


def log_softmax(logits: ArrayLike) -> np.ndarray:
    """Row-wise log-softmax, stable for large logits (subtract the row max before exp)."""
    z = _rows(logits)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl_divergence(reference: ArrayLike, current: ArrayLike) -> np.ndarray:
    """KL(P_reference || P_current) per row (nats), from raw logits; never negative.

    A row equal bit for bit to its reference row is 0 without its softmax: the full computation gives
    exactly 0 for it too (the same inputs give the same log-probabilities, whose difference is 0).  On
    the CPU every staged row is such a row, and a real model's rows are wide (gemma3: 262,144 logits),
    so this is most of a certifier's own compute."""
    ref, cur = _rows(reference), _rows(current)
    _same_shape(ref, cur)
    kl = np.zeros(ref.shape[0], dtype=np.float64)
    differ = ~(ref == cur).all(axis=-1)
    if differ.any():
        lp, lq = log_softmax(ref[differ]), log_softmax(cur[differ])
        kl[differ] = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    # Tiny negative values are rounding of a true zero, not information.
    return np.maximum(kl, 0.0)


def top1_agreement(reference: ArrayLike, current: ArrayLike) -> float:
    """Fraction of rows whose argmax agrees."""
    ref, cur = _rows(reference), _rows(current)
    _same_shape(ref, cur)
    if ref.shape[0] == 0:
        return 1.0
    return float(np.mean(ref.argmax(axis=-1) == cur.argmax(axis=-1)))


def top1_margin(logits: ArrayLike) -> np.ndarray:
    """Per row: the top-1 logit minus the top-2 logit (0 on an exact tie)."""
    z = _rows(logits)
    if z.shape[-1] < 2:
        return np.full(z.shape[0], np.inf)
    top2 = np.partition(z, -2, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def nmse(reference: ArrayLike, current: ArrayLike) -> float:
    """Normalised mean squared error: sum((cur - ref)^2) / sum(ref^2).

    A zero reference gives 0 when the current is also zero and +inf otherwise (never NaN, which
    would compare false against any limit and pass silently).
    """
    ref = np.asarray(reference, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    _same_shape(ref, cur)
    if not (np.isfinite(ref).all() and np.isfinite(cur).all()):
        return float("inf")
    err = float(np.square(cur - ref).sum())
    power = float(np.square(ref).sum())
    if power == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / power


def max_abs_diff(reference: ArrayLike, current: ArrayLike) -> float:
    ref = np.asarray(reference, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    _same_shape(ref, cur)
    return float(np.abs(cur - ref).max()) if ref.size else 0.0


def common_prefix(reference: Sequence[int], current: Sequence[int]) -> int:
    """How many leading tokens the two continuations share (up to the first divergence)."""
    n = 0
    for a, b in zip(reference, current, strict=False):
        if a != b:
            break
        n += 1
    return n


def greedy_match(reference: Sequence[int], current: Sequence[int]) -> float:
    """Fraction of the reference continuation reproduced before the first divergence."""
    return common_prefix(reference, current) / len(reference) if reference else 1.0


@dataclass(frozen=True, kw_only=True)
class Spread:
    median: float
    iqr: float
    n: int
    samples: tuple[float, ...]

    def as_dict(self) -> dict[str, object]:
        return {"median": self.median, "iqr": self.iqr, "n": self.n, "samples": list(self.samples)}


def median_iqr(samples: Sequence[float]) -> Spread:
    """Median and inter-quartile range (q75 - q25, linear interpolation) of repeated measurements."""
    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        raise ValueError("median_iqr needs at least one sample")
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return Spread(median=float(q50), iqr=float(q75 - q25), n=int(a.size), samples=tuple(float(x) for x in a))


def _same_shape(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: reference {a.shape} vs current {b.shape}")
