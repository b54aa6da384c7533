"""Several sessions decoded at the same time through one placement: aggregate throughput and parity.

One stream keeps one stage busy at a time; a pipeline pays off when several sessions are in flight,
each stage working on another session's token.  Each session here runs in a driver thread of its own,
with its own (session, epoch) and its own route (a chained route has its own sink), all released
together by a barrier once their routes are open.

- Aggregate tok/s: every token the sessions chose (the prefill's first included), over the time from
  the barrier to the last session's last token.  The same definition for the monolithic worker and
  for every placement, so their ratio is like for like.
- Parity: each concurrent session must choose the tokens and produce the logits, bitwise, that a
  session of the same prompt alone on the same workers produces (a worker holds one llama context
  per session: nothing of one session may leak into another's).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from core.errors import ConfigurationError
from pipeline import drive
from pipeline.routes import LOOPBACK, RELAYED, Reach, RouteSpec
from worker.client import StageClient


@dataclass(frozen=True, kw_only=True)
class Session:
    tokens: tuple[int, ...]
    logits: np.ndarray  # the last row of every pass
    started: float  # perf_counter at the barrier
    ended: float


@dataclass(frozen=True, kw_only=True)
class Together:
    """One run of ``len(sessions)`` sessions decoded at the same time."""

    sessions: tuple[Session, ...]

    @property
    def wall_seconds(self) -> float:
        return max(s.ended for s in self.sessions) - min(s.started for s in self.sessions)

    @property
    def aggregate_tok_s(self) -> float:
        return sum(len(s.tokens) for s in self.sessions) / self.wall_seconds


def decode_together(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    n_sessions: int,
    *,
    boundary_dtype: str = "f32",
    route: RouteSpec = RELAYED,
    reach: Reach = LOOPBACK,
) -> Together:
    """Decode ``n_sessions`` fresh sessions of ``prompt`` at once (each reset afterwards)."""
    if n_sessions < 1:
        raise ConfigurationError("concurrency needs at least one session")
    infos = drive.describe(stages)
    barrier = threading.Barrier(n_sessions)

    def one(k: int) -> Session:
        session = drive.new_session(f"together{n_sessions}-{k}")
        with route.open(stages, infos, reach) as opened:
            try:
                barrier.wait()
                started = time.perf_counter()
                tokens, logits = drive.greedy_session(
                    opened, prompt, n_decode, session=session, boundary_dtype=boundary_dtype
                )
                ended = time.perf_counter()
            except BaseException:
                barrier.abort()  # the other threads stop waiting for this one
                drive.abandon_session(stages, session)
                raise
            drive.reset_session(stages, session)
        return Session(tokens=tuple(tokens), logits=logits, started=started, ended=ended)

    with ThreadPoolExecutor(max_workers=n_sessions, thread_name_prefix="dgr-session") as pool:
        futures = [pool.submit(one, k) for k in range(n_sessions)]
        return Together(sessions=tuple(f.result() for f in futures))


def diverging(together: Together, alone: Session) -> list[int]:
    """Indices of the concurrent sessions whose tokens or logits are not bitwise the lone session's."""
    return [
        k
        for k, s in enumerate(together.sessions)
        if s.tokens != alone.tokens
        or s.logits.shape != alone.logits.shape
        or s.logits.tobytes() != alone.logits.tobytes()
    ]
