"""pipeline/yielding.py: while a ring is read, every thread of the driver runs SCHED_BATCH, and each
goes back to what it was when the last overlapping ring ends."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from pipeline import yielding
from pipeline.yielding import yielding_to_stages

pytestmark = pytest.mark.skipif(not yielding.supported(), reason="SCHED_BATCH is Linux's")


@contextmanager
def parked_thread(policy: int | None = None) -> Iterator[int]:
    """A thread that waits until the block ends; yields its id (optionally under ``policy`` first)."""
    ready, done, tid = threading.Event(), threading.Event(), []

    def park() -> None:
        if policy is not None:
            os.sched_setscheduler(0, policy, os.sched_param(0))
        tid.append(threading.get_native_id())
        ready.set()
        done.wait()

    t = threading.Thread(target=park)
    t.start()
    ready.wait()
    try:
        yield tid[0]
    finally:
        done.set()
        t.join()


def policy(tid: int = 0) -> int:
    return os.sched_getscheduler(tid)


def test_every_thread_yields_inside_and_returns_after() -> None:
    with parked_thread() as before:
        with yielding_to_stages():
            with parked_thread() as started_inside:
                assert policy() == policy(before) == policy(started_inside) == os.SCHED_BATCH
                with yielding_to_stages():  # nested: the outer one switches back
                    pass
                assert policy(started_inside) == os.SCHED_BATCH
            assert policy() == os.SCHED_BATCH
        assert policy() == policy(before) == os.SCHED_OTHER


def test_a_thread_started_inside_goes_back_too() -> None:
    with ExitStack() as parked:
        with yielding_to_stages():
            started_inside = parked.enter_context(parked_thread())
        assert policy(started_inside) == os.SCHED_OTHER


def test_overlapping_rings_switch_back_when_the_last_ends() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first() -> None:
        with yielding_to_stages():
            first_in.set()
            second_in.wait()
        first_out.set()

    def second() -> None:
        first_in.wait()
        with yielding_to_stages():
            second_in.set()
            first_out.wait()
            seen["after the first ended"] = policy()
        seen["after both"] = policy()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"after the first ended": os.SCHED_BATCH, "after both": os.SCHED_OTHER}


def test_a_thread_already_batch_stays_batch_and_disabled_changes_nothing() -> None:
    with parked_thread(os.SCHED_BATCH) as chosen:
        with yielding_to_stages():
            pass
        assert policy(chosen) == os.SCHED_BATCH and policy() == os.SCHED_OTHER
    with yielding_to_stages(enabled=False):
        assert policy() == os.SCHED_OTHER
