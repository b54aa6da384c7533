"""pipeline.concurrency's parity check and throughput figure, on sessions made by hand."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import ConfigurationError
from pipeline.concurrency import Session, Together, decode_together, diverging

LOGITS = np.arange(12, dtype=np.float32).reshape(3, 4)


def _session(tokens=(1, 2, 3), logits=LOGITS, started=0.0, ended=1.0) -> Session:
    return Session(tokens=tuple(tokens), logits=logits, started=started, ended=ended)


def test_identical_sessions_do_not_diverge() -> None:
    together = Together(sessions=(_session(), _session(started=0.5, ended=2.0)))
    assert diverging(together, _session()) == []
    # 6 tokens from the first start to the last end
    assert together.wall_seconds == 2.0 and together.aggregate_tok_s == 3.0


def test_a_token_a_flipped_bit_or_a_missing_row_is_named() -> None:
    flipped = LOGITS.copy()
    flipped.view(np.uint32)[1, 2] ^= 1  # one ulp: no tolerance
    together = Together(
        sessions=(
            _session(),
            _session(tokens=(1, 2, 4)),
            _session(logits=flipped),
            _session(logits=LOGITS[:2]),
        )
    )
    assert diverging(together, _session()) == [1, 2, 3]


def test_negative_zero_is_not_zero_here() -> None:
    a = np.zeros((1, 2), dtype=np.float32)
    assert diverging(Together(sessions=(_session(logits=-a),)), _session(logits=a)) == [0]


def test_no_sessions_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least one session"):
        decode_together([], [1], 2, 0)
