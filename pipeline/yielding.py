"""The driver yields the CPU to the stages while a ring decodes.

In a ring the driver is off the token's critical path: it only reads deliveries.  Yet each delivery
wakes its threads (the delivery port's reader, or gRPC's poller and the sink's handler, then the
ring's reader), and on a host that also runs stages the kernel may wake them on the core where a
stage is computing and preempt that stage.
Measured on a 2-core VM, tiny-llama, token-only ring (worker/README.md, "Ring decode"): stage 0 was
preempted 3.5 times per token at 2 stages and its compute grew from 0.82 to 1.18 ms.

``SCHED_BATCH`` is the policy that says so to the kernel: a woken batch thread never preempts a
running one, yet keeps its fair share of the CPU (nice still counts), so a loaded machine slows the
driver's reading but cannot starve it.  ``SCHED_IDLE`` would starve it under load (rings time out),
and a higher nice value still preempts on wake-up.  Every thread of this process is switched, since
gRPC's threads are not ours to name; threads started meanwhile inherit the policy and are switched
back too.  Other threads of the process (a test's own servers) yield as well for that time, which
costs them nothing on an idle core.

Rings may overlap (concurrent sessions, one ring per thread): the first to start switches, the last
to end switches back.  Where the policy cannot be set (not Linux, a thread under a real-time or
``SCHED_IDLE`` policy that someone else chose) the thread is left as it is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator
from contextlib import contextmanager

_TASKS = "/proc/self/task"
_lock = threading.Lock()
_depth = 0  # rings running in this process
_switched: set[int] = set()  # thread ids this module set to SCHED_BATCH
_present: set[int] = set()  # thread ids alive when the first ring started


def supported() -> bool:
    return hasattr(os, "SCHED_BATCH") and os.path.isdir(_TASKS)


def _threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir(_TASKS)}
    except OSError:
        return set()


def _set(tid: int, policy: int) -> bool:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
    except OSError:  # the thread ended, or its policy is not ours to change
        return False
    return True


def _policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except OSError:
        return None


def _to_batch() -> None:
    _present.clear()
    _present.update(_threads())
    _switched.clear()
    _switched.update(t for t in _present if _policy(t) == os.SCHED_OTHER and _set(t, os.SCHED_BATCH))


def _back() -> None:
    for tid in _threads():
        if _policy(tid) == os.SCHED_BATCH and (tid in _switched or tid not in _present):
            _set(tid, os.SCHED_OTHER)
    _switched.clear()
    _present.clear()


@contextmanager
def yielding_to_stages(enabled: bool = True) -> Generator[None]:
    """While inside, this process's threads run ``SCHED_BATCH`` (see the module docstring)."""
    global _depth
    if not (enabled and supported()):
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _to_batch()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _back()
