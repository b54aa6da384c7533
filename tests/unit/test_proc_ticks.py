"""tests.proc_ticks on a /proc tree made here: a thread that ended after the listing is left out (the
helper used to raise FileNotFoundError, failing test_worker_threads under the sanitizer)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.proc_ticks import cpu_ticks


def _task(proc: Path, tid: int, name: str, utime: int, stime: int) -> None:
    task = proc / "42" / "task" / str(tid)
    task.mkdir(parents=True)
    fields = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 30
    (task / "stat").write_text(f"{tid} (a (b) c) " + " ".join(fields) + "\n")
    (task / "comm").write_text(name + "\n")


def test_a_thread_that_ended_after_the_listing_is_left_out(tmp_path: Path) -> None:
    _task(tmp_path, 42, "dgr-shard-worker", 5, 2)
    _task(tmp_path, 43, "dgr-compute", 300, 7)
    gone = tmp_path / "42" / "task" / "44"
    gone.mkdir()  # listed, but its files are gone when read
    assert cpu_ticks(42, tmp_path) == {42: ("dgr-shard-worker", 7), 43: ("dgr-compute", 307)}


def test_this_process_reads_as_itself() -> None:
    ticks = cpu_ticks(os.getpid())
    assert os.getpid() in ticks and all(t >= 0 for _, t in ticks.values())
