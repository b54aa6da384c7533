"""CPU time per thread of a running process, from /proc: which threads of a worker computed.

A thread may end between listing /proc/PID/task and reading its files (a gRPC or ASan helper thread
does, under a sanitizer's timing most of all); such a thread computed nothing worth counting since, so it
is left out rather than failing the reading (test_worker_threads failed on it under `nox -s sanitize`).
"""

from __future__ import annotations

from pathlib import Path

Ticks = dict[int, tuple[str, int]]


def cpu_ticks(pid: int, proc: Path = Path("/proc")) -> Ticks:
    """Thread id -> (name, user + system clock ticks so far), for the threads alive while read."""
    ticks = {}
    for task in (proc / str(pid) / "task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended after the listing
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[int(task.name)] = (name, int(fields[11]) + int(fields[12]))
    return ticks
