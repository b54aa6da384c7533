"""Pipelined prefill's schedule: chunk i+1 on stage k while chunk i is on stage k+1.

A prompt longer than one pass is cut into chunks; run in turn, every stage but one idles while a chunk
crosses the pipeline, so a prefill over s stages takes the sum of their times.  Overlapped, stage k
takes chunk i+1 as soon as it has handed chunk i on, and a prefill of many chunks takes about the
slowest stage's time: what a pipeline earns on long prompts.  Each stage still computes its chunks in
order (one thread per stage, fed by the stage before it through a FIFO), so its KV is written in the
order the unpipelined prefill writes it, and on the CPU lane the logits are bitwise the same.

This module only schedules: ``overlapped`` calls ``step(k, i, relay)`` for stage k and chunk i, where
``relay`` is what stage k-1 gave for chunk i (None at stage 0), on one thread per stage.  What a step
sends and how (pipeline/routes.py, ``Pipelined``) is the route's business.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Reply = TypeVar("Reply")


class _Stopped:
    """Put into a stage's inbox when the stage before it failed: nothing more will come."""


@dataclass(kw_only=True)
class Schedule(Generic[Reply]):
    """Every (chunk, stage) reply and when each chunk left the last stage (time.perf_counter)."""

    replies: list[list[Reply | None]]
    finished: list[float] = field(default_factory=list[float])


def overlapped(
    n_stages: int, n_chunks: int, step: Callable[[int, int, Reply | None], Reply]
) -> Schedule[Reply]:
    """Run every chunk through every stage, stages side by side; the first failure is raised once every
    thread has stopped, and no stage starts a chunk after one failed."""
    done = Schedule[Reply](replies=[[None] * n_stages for _ in range(n_chunks)], finished=[0.0] * n_chunks)
    inboxes: list[queue.SimpleQueue[Reply | _Stopped | None]] = [queue.SimpleQueue() for _ in range(n_stages)]
    failed = threading.Event()
    errors: list[BaseException] = []  # in the order they happened (list.append is atomic)

    def run_stage(k: int) -> None:
        for i in range(n_chunks):
            relay = inboxes[k].get() if k else None
            if isinstance(relay, _Stopped) or failed.is_set():
                break
            try:
                reply = step(k, i, relay)
            except BaseException as exc:  # raised on the caller's thread below
                errors.append(exc)
                failed.set()
                break
            done.replies[i][k] = reply
            if k + 1 < n_stages:
                inboxes[k + 1].put(reply)
            else:
                done.finished[i] = time.perf_counter()
        if k + 1 < n_stages:
            inboxes[k + 1].put(
                _Stopped()
            )  # harmless after the last chunk: the next stage has stopped reading

    threads = [
        threading.Thread(target=run_stage, args=(k,), name=f"dgr-prefill-stage-{k}") for k in range(n_stages)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return done
