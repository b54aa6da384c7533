"""One session driven to depth: a long prompt in passes of the stages' batch, then greedy decode.

``drive.run_placement`` keeps every position's logits and every seam's boundary, which a prompt of a
few dozen tokens affords and one of 120k does not (120k rows of a 32k vocabulary are 15 GiB).  At depth
the driver keeps what the depth gates judge: the last logits row of every prefill pass (positions spread
over the whole context, each one the pass's own computation at that depth) and every decoded row, plus
each pass's timing.  The route is the placement's, opened as every other run opens it; the decode is
the driver's, pass by pass, on the route's driver-fed spec, so the same rows exist on every route.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline import drive
from pipeline.routes import LOOPBACK, RELAYED, PassOptions, Reach, Route, RouteSpec, chunked
from worker.client import StageClient, StageInfo


@dataclass(frozen=True, kw_only=True)
class DepthTrace:
    """What one prompt at depth gave: the judged rows and how long its prefill and decode took."""

    prompt_tokens: int
    positions: tuple[int, ...]  # the position of each logits row
    logits: np.ndarray  # [len(positions), n_vocab] float32: each pass's last row, then each decoded one
    tokens: tuple[int, ...]  # the greedy continuation
    prefill_passes: int
    prefill_seconds: float
    decode_seconds: float
    # each stage's session state at the end, as the worker would save it (KV rows and cells of its
    # layers, compressed caches included): what holding this context costs, measured
    held_bytes: tuple[int, ...] = ()

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else float("nan")


def run_at_depth(
    stages: Sequence[StageClient],
    prompt: Sequence[int],
    n_decode: int,
    *,
    route: RouteSpec = RELAYED,
    reach: Reach = LOOPBACK,
    boundary_dtype: str = "f32",
    tag: str = "depth",
) -> DepthTrace:
    """Prefill ``prompt`` in passes of the smallest n_batch of the stages, then decode ``n_decode``
    tokens greedily; the session is reset afterwards (on failure too)."""
    infos = drive.describe(stages)
    drive.fits(infos, len(prompt) + n_decode)
    session = drive.new_session(tag)
    with route.driver_fed().open(stages, infos, reach) as opened:
        try:
            trace = _session(opened, infos, prompt, n_decode, session, boundary_dtype)
        except BaseException:
            opened.drain(quiet=True)
            drive.abandon_session(stages, session)
            raise
        opened.drain()
    held = tuple(s.session(session).state_bytes for s in stages)
    drive.reset_session(stages, session)
    return dataclasses.replace(trace, held_bytes=held)


def _session(
    route: Route,
    infos: Sequence[StageInfo],
    prompt: Sequence[int],
    n_decode: int,
    session: str,
    dtype: str,
) -> DepthTrace:
    chunks = chunked(prompt, drive.batch_of(infos, len(prompt)))
    t0 = time.perf_counter()
    passes = route.prefill(session, 1, chunks, PassOptions(boundary_dtype=dtype))
    rows = [done.logits[-1] for done in passes]
    positions = [c.positions[-1] for c in chunks]
    prefill_s = time.perf_counter() - t0
    tokens = [int(np.argmax(rows[-1]))]
    t1 = time.perf_counter()
    options = PassOptions(boundary_dtype=dtype, all_logits=True)
    while len(tokens) < n_decode:
        position = len(prompt) + len(tokens) - 1
        done = route.forward(session, 1, [position], [tokens[-1]], options)
        rows.append(done.logits[-1])
        positions.append(position)
        tokens.append(int(np.argmax(rows[-1])))
    return DepthTrace(
        prompt_tokens=len(prompt),
        positions=tuple(positions),
        logits=np.stack(rows).astype(np.float32, copy=False),
        tokens=tuple(tokens),
        prefill_passes=len(chunks),
        prefill_seconds=prefill_s,
        decode_seconds=time.perf_counter() - t1,
    )
