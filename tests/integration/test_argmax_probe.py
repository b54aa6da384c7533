"""The worker's greedy pick (worker/src/argmax.cpp: a ring's last stage and the MTP drafter choose
with it) against numpy.argmax, through dgr-argmax-probe of the CPU lane build.

The driver holds every ring token to ``np.argmax`` of the logits delivered with it, but only for rows
a model happens to produce; here the rows are made to hit every rule: the first NaN wins (ahead of
+inf), the first of equal maxima wins, -0.0 and +0.0 tie, all -inf, one element, vocabulary sizes
around the vector width, and random rows of V4 Flash's vocabulary size.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from lanes.build import ARGMAX_PROBE_TARGET

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _picks(cpu_build, rows: np.ndarray) -> list[int]:
    probe = cpu_build.dir / "bin" / ARGMAX_PROBE_TARGET
    data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
    out = subprocess.run([str(probe), str(rows.shape[1])], input=data, capture_output=True, check=True)
    return [int(line) for line in out.stdout.split()]


def _special(n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    rows = [rng.standard_normal(n).astype(np.float32) for _ in range(8)]
    rows[1][n // 3] = rows[1][2 * n // 3] = rows[1].max() + 1  # equal maxima: the first
    rows[2][n - 1] = np.nan  # a NaN wins over everything, even the row's last place
    rows[3][n // 2] = np.inf
    rows[3][n - 1] = np.nan  # ... over +inf too
    rows[4][:] = -np.inf  # all -inf: index 0
    rows[5][:] = 0.0
    rows[5][0] = -0.0  # -0.0 and +0.0 are equal: index 0
    rows[6][n // 2] = np.nan
    rows[6][n // 4] = np.nan  # the first NaN
    rows[7][:] = 1.0  # all equal: index 0
    return np.stack(rows)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 15, 16, 17, 33, 1000, 32000])
def test_the_greedy_pick_is_numpy_argmax_on_every_rule(cpu_build, n: int) -> None:
    rows = _special(n)
    assert _picks(cpu_build, rows) == [int(np.argmax(r)) for r in rows]


def test_the_greedy_pick_is_numpy_argmax_on_random_rows_of_a_large_vocabulary(cpu_build) -> None:
    rng = np.random.default_rng(19)
    rows = rng.standard_normal((64, 129280)).astype(np.float32)  # V4 Flash's vocabulary
    rows[::7, 5] = rows[::7].max(axis=1) + 1e-3  # a maximum near the front on some rows
    rows[::11, -1] = rows[::11].max(axis=1) + 1e-3  # and at the very end on others
    assert _picks(cpu_build, rows) == [int(np.argmax(r)) for r in rows]
