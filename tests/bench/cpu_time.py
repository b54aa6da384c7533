"""CPU time of worker processes, for benches that set it beside their speed figures.

Where stages share cores (12 one-layer stages on a 2-core box), a token costs the sum of every
stage's CPU time, not the longest stage's: one stage's work per pass (parsing, bookkeeping, the
kernel's socket calls) is paid once per stage.  Reads ``/proc/PID/task/*/schedstat`` (nanoseconds on
a CPU, per thread), not ``/proc/PID/stat``, whose 10 ms ticks are too coarse for a run of seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def cpu_seconds(pids: Iterable[int]) -> float:
    """Every thread's time on a CPU so far, summed over the processes (Linux; 0 where unreadable)."""
    total_ns = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                total_ns += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended between the listing and the read
    return total_ns / 1e9
