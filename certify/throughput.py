"""The speed gate's throughput figures: several sessions decoded at once through one placement.

For each concurrency level the recipe asks for (``measure.concurrency``), ``concurrency_rounds`` runs
of that many sessions at the same time (pipeline.concurrency), each session held bitwise to the same
session decoded alone on the same workers.  The figures: aggregate tok/s (median, IQR) per level and
how many concurrent sessions differed from the lone one (the gate holds that at 0: a worker that
mixes sessions' state must not pass).  A level the workers cannot hold (more sessions than their
``--max-sessions``, as attached workers may be started) is recorded as skipped, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from certify import metrics
from pipeline.concurrency import Together, decode_together, diverging
from pipeline.routes import LOOPBACK, RELAYED, Reach, RouteSpec
from worker.client import StageClient, StageFailed


def concurrency_figures(
    clients: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    levels: Sequence[int],
    *,
    rounds: int,
    boundary_dtype: str = "f32",
    route: RouteSpec = RELAYED,
    reach: Reach = LOOPBACK,
) -> dict[str, Any]:
    """Aggregate tok/s and diverging sessions at each level, each session on its own ``route``."""

    def together_at(sessions: int) -> Together:
        return decode_together(
            clients, prompt, n_decode, sessions, boundary_dtype=boundary_dtype, route=route, reach=reach
        )

    alone = together_at(1)
    lone = alone.sessions[0]
    rows: list[dict[str, Any]] = []
    for sessions in levels:
        rates, differing = [], 0
        try:
            for _ in range(rounds):
                together = together_at(sessions)
                differing += len(diverging(together, lone))
                rates.append(together.aggregate_tok_s)
        except StageFailed as exc:
            if "too many sessions" not in str(exc):
                raise
            rows.append({"sessions": sessions, "skipped": f"the workers hold fewer sessions: {exc}"})
            continue
        rows.append(
            {
                "sessions": sessions,
                "aggregate_tok_s": metrics.median_iqr(rates).as_dict(),
                "diverging_sessions": differing,
                "rounds": rounds,
            }
        )
    return {
        "decode_tokens": n_decode,
        "levels": rows,
        "diverging_sessions": sum(r.get("diverging_sessions", 0) for r in rows),
    }
